/* test-kn-attn.c — the paged KV cache and attention: the page layout of
 * kv_write, closed forms (one key returns V, a zero query averages the visible
 * V), SIMD against reference over a grid of head dims, windows, GQA ratios,
 * KV dtypes, ragged batches and block tables with holes, and bit-exact batch
 * and chunking invariance. */
#include <math.h>
#include <stdio.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu-impl.h"
#include "tests/unit/kernels/kn-test-util.h"

/* A pool and one layer's view into it; K/V of every position of every
 * sequence are kept in plain arrays too, for closed-form checks. */
struct kt_cache {
  struct kn_kv_view view;
  int n_seq, len; /* sequences, positions each */
  int32_t *bt;    /* [n_seq, n_blocks] block tables */
  int n_blocks;
  float *k, *v; /* [n_seq, len, kvh, D] */
};

/* Fills a pool of pages for n_seq sequences of len positions, pages handed out
 * in a shuffled order, the layer's K and V at offsets inside the pages behind
 * another layer's space (so offsets are exercised). */
static void cache_init(struct kt_cache *c, struct kn_backend *be, int n_seq, int len, int kvh,
                       int D, int block_tokens, enum kn_dtype dt) {
  memset(c, 0, sizeof(*c));
  size_t elt = kn_dtype_size(dt);
  size_t blk = (size_t)block_tokens * kvh * D * elt;
  c->n_seq = n_seq;
  c->len = len;
  c->n_blocks = (len + block_tokens - 1) / block_tokens;
  int n_pages = n_seq * c->n_blocks + 3;
  c->view = (struct kn_kv_view){.page_bytes = 4 * blk + 64,
                                .n_pages = n_pages,
                                .k_off = 2 * blk + 32,
                                .v_off = 32,
                                .block_tokens = block_tokens,
                                .n_kv_heads = kvh,
                                .head_dim = D,
                                .dtype = dt};
  c->view.pool = kn_alloc(be, (size_t)n_pages * c->view.page_bytes);
  TH_REQUIRE(c->view.pool);
  memset(c->view.pool, 0xff, (size_t)n_pages * c->view.page_bytes); /* NaN everywhere */
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_pages);
  TH_REQUIRE(perm);
  for (int i = 0; i < n_pages; i++)
    perm[i] = i;
  for (int i = n_pages - 1; i > 0; i--) {
    int j = kt_int(i + 1);
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  c->bt = malloc(sizeof(int32_t) * (size_t)n_seq * c->n_blocks);
  TH_REQUIRE(c->bt);
  for (int i = 0; i < n_seq * c->n_blocks; i++)
    c->bt[i] = perm[i];
  free(perm);
  size_t row = (size_t)kvh * D;
  c->k = kt_rand_f32((size_t)n_seq * len * row, 1.0f);
  c->v = kt_rand_f32((size_t)n_seq * len * row, 1.0f);
  if (dt != KN_DTYPE_F32) /* keep the plain copies equal to what the cache holds */
    for (size_t i = 0; i < (size_t)n_seq * len * row; i++) {
      uint16_t tk, tv; /* room for one element of any cache type */
      kn_store_f32(&tk, dt, 0, c->k[i]);
      kn_store_f32(&tv, dt, 0, c->v[i]);
      c->k[i] = kn_load_f32(&tk, dt, 0);
      c->v[i] = kn_load_f32(&tv, dt, 0);
    }
  int32_t *slots = malloc(sizeof(int32_t) * (size_t)len);
  TH_REQUIRE(slots);
  for (int s = 0; s < n_seq; s++) {
    for (int p = 0; p < len; p++)
      slots[p] = c->bt[s * c->n_blocks + p / block_tokens] * block_tokens + p % block_tokens;
    TH_REQUIRE(kn_kv_write(be, &c->view, slots, c->k + (size_t)s * len * row, (ptrdiff_t)row,
                           c->v + (size_t)s * len * row, (ptrdiff_t)row, len) == 0);
  }
  free(slots);
}

static void cache_free(struct kt_cache *c, struct kn_backend *be) {
  kn_free(be, c->view.pool);
  free(c->bt);
  free(c->k);
  free(c->v);
}

static struct kn_attn_seq seq_of(const struct kt_cache *c, int s, int q_begin, int pos0, int n_q) {
  return (struct kn_attn_seq){.q_begin = q_begin,
                              .n_q = n_q,
                              .pos0 = pos0,
                              .block_table = c->bt + s * c->n_blocks,
                              .n_blocks = c->n_blocks};
}

/* ---- layout ------------------------------------------------------------- */

TH_TEST(kv_write_page_layout) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 2);
  kt_seed(10);
  for (int bf = 0; bf < 2; bf++) {
    enum kn_dtype dt = bf ? KN_DTYPE_BF16 : KN_DTYPE_F32;
    struct kt_cache c;
    cache_init(&c, be, 2, 21, 2, 8, 5, dt);
    size_t elt = kn_dtype_size(dt);
    int ok = 1;
    for (int s = 0; s < 2; s++)
      for (int p = 0; p < 21; p++)
        for (int h = 0; h < 2; h++)
          for (int d = 0; d < 8; d++) {
            int32_t page = c.bt[s * c.n_blocks + p / 5];
            size_t at = (size_t)page * c.view.page_bytes +
                        ((size_t)(p % 5) * 2 + (size_t)h) * 8 * elt + (size_t)d * elt;
            const char *pool = c.view.pool;
            size_t i = (((size_t)s * 21 + p) * 2 + h) * 8 + d;
            ok &= kn_load_f32(pool + at + c.view.k_off, dt, 0) == c.k[i];
            ok &= kn_load_f32(pool + at + c.view.v_off, dt, 0) == c.v[i];
          }
    TH_CHECK(ok);
    /* negative slots are skipped; a slot past the pool is an error */
    int32_t slots[2] = {-1, c.view.n_pages * 5};
    float kv[32] = {0};
    TH_CHECK_EQ_INT(kn_kv_write(be, &c.view, slots, kv, 16, kv, 16, 1), 0);
    TH_CHECK_EQ_INT(kn_kv_write(be, &c.view, slots, kv, 16, kv, 16, 2), CM_ERR_RANGE);
    cache_free(&c, be);
  }
  kn_backend_destroy(be);
}

/* ---- closed forms ------------------------------------------------------- */

TH_TEST(attention_closed_forms) {
  struct kn_backend *bes[2] = {kt_backend(KN_CPU_ISA_REF, 1), kt_backend(KN_CPU_ISA_AVX512, 2)};
  kt_seed(11);
  for (int b = 0; b < 2; b++) {
    struct kn_backend *be = bes[b];
    int D = 64, kvh = 2, H = 4, len = 40;
    struct kt_cache c;
    cache_init(&c, be, 1, len, kvh, D, 16, KN_DTYPE_F32);
    size_t row = (size_t)H * D;
    float *q = kt_rand_f32(row * len, 2.0f);
    float *out = kt_guarded(row * len);
    /* one key: the output is that key's V, exactly */
    struct kn_attn_seq s = seq_of(&c, 0, 0, 0, 1);
    TH_REQUIRE(kn_attention(be, out, (ptrdiff_t)row, q, (ptrdiff_t)row, &c.view, &s, 1, H, 0,
                            0.125f, 0.0f) == 0);
    for (int h = 0; h < H; h++)
      TH_CHECK(kt_bits_equal(out + h * D, c.v + (h / 2) * D, (size_t)D));
    TH_CHECK(kt_is_sentinel(out + row)); /* row 1 was not asked for */
    /* a zero query averages the visible values: causal, window 5, bidir [20, 30) */
    memset(q, 0, sizeof(float) * row * len);
    for (int mode = 0; mode < 3; mode++) {
      int window = mode == 1 ? 5 : 0;
      int32_t range[2] = {20, 30};
      s = seq_of(&c, 0, 0, 0, len);
      if (mode == 2) {
        s.bidir = range;
        s.n_bidir = 1;
      }
      TH_REQUIRE(kn_attention(be, out, (ptrdiff_t)row, q, (ptrdiff_t)row, &c.view, &s, 1, H, window,
                              1.0f, 0.0f) == 0);
      double worst = 0.0;
      for (int p = 0; p < len; p++) {
        int lo = window ? (p - window + 1 > 0 ? p - window + 1 : 0) : 0, hi = p;
        if (mode == 2 && p >= 20 && p < 30) hi = 29;
        for (int h = 0; h < H; h++)
          for (int d = 0; d < D; d++) {
            double m = 0.0;
            for (int j = lo; j <= hi; j++)
              m += c.v[((size_t)j * kvh + h / 2) * D + d];
            m /= hi - lo + 1;
            double e = fabs(out[(size_t)p * row + (size_t)h * D + d] - m);
            if (e > worst) worst = e;
          }
      }
      if (!(worst < 2e-6))
        th_fail(__FILE__, __LINE__, "mean of visible V: mode %d err %g", mode, worst);
    }
    TH_CHECK(kt_guards_ok(out, row * len));
    free(q);
    kt_guarded_free(out);
    cache_free(&c, be);
  }
  kn_backend_destroy(bes[0]);
  kn_backend_destroy(bes[1]);
}

/* ---- SIMD against reference over a grid ------------------------------------ */

static void grid_case(struct kn_backend *ref, struct kn_backend *simd, int D, int H, int kvh,
                      int window, int block_tokens, enum kn_dtype dt, float softcap, double tol) {
  /* three sequences: a prefill chunk in the middle of a prompt, a decode, a
   * prefill from 0 with an image range; rows interleaved with a gap row */
  int len = 75;
  struct kt_cache c;
  cache_init(&c, ref, 3, len, kvh, D, block_tokens, dt);
  struct kn_attn_seq seqs[3] = {seq_of(&c, 0, 0, 30, 37), seq_of(&c, 1, 38, 74, 1),
                                seq_of(&c, 2, 39, 0, 36)};
  int32_t range[2] = {10, 18};
  seqs[2].bidir = range;
  seqs[2].n_bidir = 1;
  /* blocks wholly out of every window become holes */
  if (window)
    for (int s = 0; s < 2; s++) {
      int lo = seqs[s].pos0 - window + 1;
      for (int b = 0; b < c.n_blocks; b++)
        if ((b + 1) * block_tokens - 1 < lo) c.bt[s * c.n_blocks + b] = -1;
    }
  int T = 75;
  ptrdiff_t ldq = (ptrdiff_t)H * D + 8, ldo = (ptrdiff_t)H * D + 3;
  float *q = kt_rand_f32((size_t)T * ldq, 1.0f);
  size_t n_out = (size_t)(T - 1) * ldo + (size_t)H * D;
  float *a = kt_guarded(n_out), *b = kt_guarded(n_out);
  float scale = 1.0f / sqrtf((float)D) * 4.0f;
  TH_REQUIRE(kn_attention(ref, a, ldo, q, ldq, &c.view, seqs, 3, H, window, scale, softcap) == 0);
  TH_REQUIRE(kn_attention(simd, b, ldo, q, ldq, &c.view, seqs, 3, H, window, scale, softcap) == 0);
  TH_CHECK(kt_guards_ok(a, n_out) && kt_guards_ok(b, n_out));
  TH_CHECK(kt_is_sentinel(a + 37 * ldo) && kt_is_sentinel(b + 37 * ldo)); /* the gap row */
  double worst = 0.0;
  for (int t = 0; t < T; t++) {
    if (t == 37) continue;
    double e = kt_nmse(b + t * ldo, a + t * ldo, (size_t)H * D);
    if (!kt_all_finite(a + t * ldo, (size_t)H * D)) e = INFINITY;
    if (e > worst) worst = e;
    TH_CHECK(kt_is_sentinel(b + t * ldo + H * D)); /* row padding untouched */
  }
  if (getenv("KT_VERBOSE"))
    printf("attn D=%d H=%d kvh=%d W=%d bt=%d %s cap=%g nmse %g\n", D, H, kvh, window, block_tokens,
           kn_dtype_name(dt), softcap, worst);
  if (!(worst < tol))
    th_fail(__FILE__, __LINE__, "%s attention D=%d H=%d kvh=%d W=%d bt=%d %s: nmse %g",
            kn_backend_name(simd), D, H, kvh, window, block_tokens, kn_dtype_name(dt), worst);
  free(q);
  kt_guarded_free(a);
  kt_guarded_free(b);
  cache_free(&c, ref);
}

TH_TEST(attention_simd_matches_reference) {
  struct kn_backend *ref = kt_backend(KN_CPU_ISA_REF, 2), *simd = kt_backend(KN_CPU_ISA_AVX512, 2);
  kt_seed(12);
  static const int dims[] = {64, 256, 512, 40, 36}; /* 36: not a multiple of 8 */
  static const int gqa[][2] = {{1, 1}, {4, 1}, {8, 2}, {12, 1}};
  static const int windows[] = {0, 7, 32};
  for (size_t di = 0; di < CM_ARRAY_LEN(dims); di++)
    for (size_t gi = 0; gi < CM_ARRAY_LEN(gqa); gi++)
      for (size_t wi = 0; wi < CM_ARRAY_LEN(windows); wi++) {
        /* keep the grid quick (it runs under ASan too): the wide heads with
         * fewer groups and windows, both KV dtypes and block sizes still */
        if (dims[di] >= 256 && (gqa[gi][0] > 8 || wi == 2)) continue;
        if (dims[di] == 512 && gqa[gi][0] > 4) continue;
        int bt = (di + gi + wi) % 2 ? 16 : 5;
        enum kn_dtype dt = (di + wi) % 2 ? KN_DTYPE_BF16 : KN_DTYPE_F32;
        float cap = wi == 1 && gi == 1 ? 50.0f : 0.0f;
        grid_case(ref, simd, dims[di], gqa[gi][0], gqa[gi][1], windows[wi], bt, dt, cap, 1e-12);
      }
  kn_backend_destroy(ref);
  kn_backend_destroy(simd);
}

/* ---- invariance ---------------------------------------------------------- */

/* For the checks below: the bf16 mode on the AMX table's kernels with the
 * tile instructions emulated (kn_cpu_backend_create_amx_emulated). */
#define ISA_AMX_EMULATED ((enum kn_cpu_isa)-1)

static struct kn_backend *backend_of(enum kn_cpu_isa isa, int threads, int bf16) {
  if (isa != ISA_AMX_EMULATED) return kt_isa_backend_mode(isa, threads, bf16);
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create_amx_emulated(threads, &be) == 0 && be);
  return be;
}

/* A 70-token prompt attended in one chunk, in uneven chunks and token by token,
 * alone or batched with other sequences: identical bits. */
static void check_attn_invariance(enum kn_cpu_isa isa, int bf16, int D, int window,
                                  enum kn_dtype dt) {
  struct kn_backend *be1 = backend_of(isa, 1, bf16), *be2 = backend_of(isa, 2, bf16);
  int len = 70, H = 4, kvh = 2;
  struct kt_cache c;
  cache_init(&c, be1, 2, len, kvh, D, 16, dt);
  ptrdiff_t ld = (ptrdiff_t)H * D;
  float *q = kt_rand_f32((size_t)len * ld * 2, 1.0f);
  float *one = malloc(sizeof(float) * (size_t)len * ld);
  float *part = malloc(sizeof(float) * (size_t)len * ld * 2);
  TH_REQUIRE(one && part);
  int32_t range[2] = {40, 48}; /* an image inside the third chunk */
  struct kn_attn_seq s = seq_of(&c, 0, 0, 0, len);
  s.bidir = range;
  s.n_bidir = 1;
  TH_REQUIRE(kn_attention(be2, one, ld, q, ld, &c.view, &s, 1, H, window, 0.1f, 0.0f) == 0);

  /* chunks [0, 23), [23, 33), [33, 70) */
  static const int cuts[] = {0, 23, 33, 70};
  memset(part, 0, sizeof(float) * (size_t)len * ld);
  for (int i = 0; i + 1 < (int)CM_ARRAY_LEN(cuts); i++) {
    struct kn_attn_seq cs = s;
    cs.pos0 = cuts[i];
    cs.n_q = cuts[i + 1] - cuts[i];
    cs.q_begin = 0;
    TH_REQUIRE(kn_attention(i & 1 ? be1 : be2, part + cuts[i] * ld, ld, q + cuts[i] * ld, ld,
                            &c.view, &cs, 1, H, window, 0.1f, 0.0f) == 0);
  }
  TH_CHECK(kt_bits_equal(part, one, (size_t)len * ld));

  /* token by token (the image tokens as one chunk, as the scheduler sends them) */
  memset(part, 0, sizeof(float) * (size_t)len * ld);
  for (int p = 0; p < len;) {
    struct kn_attn_seq cs = s;
    cs.pos0 = p;
    cs.n_q = p == 40 ? 8 : 1;
    cs.q_begin = 0;
    /* alternating: on 2 threads a lone decode splits its heads over the threads */
    TH_REQUIRE(kn_attention(p & 1 ? be2 : be1, part + p * ld, ld, q + p * ld, ld, &c.view, &cs, 1,
                            H, window, 0.1f, 0.0f) == 0);
    p += cs.n_q;
  }
  TH_CHECK(kt_bits_equal(part, one, (size_t)len * ld));

  /* batched: sequence 1's full prompt first, then sequence 0's chunks as decodes */
  struct kn_attn_seq batch[4] = {seq_of(&c, 1, 0, 0, len), s, s, s};
  batch[1].q_begin = len;
  batch[1].pos0 = 0;
  batch[1].n_q = 33;
  batch[2].q_begin = len + 33;
  batch[2].pos0 = 33;
  batch[2].n_q = 36;
  batch[3].q_begin = len + 69;
  batch[3].pos0 = 69;
  batch[3].n_q = 1;
  float *qb = malloc(sizeof(float) * (size_t)len * ld * 2);
  TH_REQUIRE(qb);
  memcpy(qb, q + len * ld, sizeof(float) * (size_t)len * ld);
  memcpy(qb + len * ld, q, sizeof(float) * (size_t)len * ld);
  TH_REQUIRE(kn_attention(be2, part, ld, qb, ld, &c.view, batch, 4, H, window, 0.1f, 0.0f) == 0);
  if (!kt_bits_equal(part + len * ld, one, (size_t)len * ld))
    th_fail(__FILE__, __LINE__, "%s D=%d W=%d %s: batched rows differ", kn_backend_name(be2), D,
            window, kn_dtype_name(dt));
  free(qb);
  free(q);
  free(one);
  free(part);
  cache_free(&c, be1);
  kn_backend_destroy(be1);
  kn_backend_destroy(be2);
}

/* An image alone (a vision encoder's pass): every row of [0, n) sees every
 * key. Rows computed together (the SIMD kernels take them in tiles, sharing
 * each key block while it is in cache) are the bits of rows computed one by
 * one, and match the reference. */
static void check_attn_tiles(enum kn_cpu_isa isa, int bf16, int D, enum kn_dtype dt) {
  struct kn_backend *be = backend_of(isa, 2, bf16), *ref = kt_backend(KN_CPU_ISA_REF, 1);
  int len = 37, H = 3, kvh = 3; /* 37: two whole tiles of 16 and a part */
  struct kt_cache c;
  cache_init(&c, be, 1, len, kvh, D, 16, dt);
  ptrdiff_t ld = (ptrdiff_t)H * D;
  float *q = kt_rand_f32((size_t)len * ld, 1.0f);
  float *all = malloc(sizeof(float) * (size_t)len * ld), *rows = malloc(sizeof(float) * (size_t)len * ld);
  float *want = malloc(sizeof(float) * (size_t)len * ld);
  TH_REQUIRE(all && rows && want);
  int32_t range[2] = {0, len};
  struct kn_attn_seq s = seq_of(&c, 0, 0, 0, len);
  s.bidir = range;
  s.n_bidir = 1;
  TH_REQUIRE(kn_attention(be, all, ld, q, ld, &c.view, &s, 1, H, 0, 0.125f, 0.0f) == 0);
  TH_REQUIRE(kn_attention(ref, want, ld, q, ld, &c.view, &s, 1, H, 0, 0.125f, 0.0f) == 0);
  for (int p = 0; p < len; p++) {
    struct kn_attn_seq one = s;
    one.pos0 = p;
    one.n_q = 1;
    TH_REQUIRE(kn_attention(be, rows + p * ld, ld, q + p * ld, ld, &c.view, &one, 1, H, 0, 0.125f,
                            0.0f) == 0);
  }
  if (!kt_bits_equal(all, rows, (size_t)len * ld))
    th_fail(__FILE__, __LINE__, "%s D=%d %s: tiled rows differ from rows alone",
            kn_backend_name(be), D, kn_dtype_name(dt));
  /* the bf16 mode's own kernels take a bf16 cache and head dims of multiples
   * of 32, rounding the queries and probabilities: close, not equal */
  int rounded = bf16 && (isa >= KN_CPU_ISA_AVX512BF16 || isa == ISA_AMX_EMULATED) &&
                dt == KN_DTYPE_BF16 && D % 32 == 0;
  double e = kt_nmse(all, want, (size_t)len * ld);
  if (rounded ? !(e < 1e-4 && e > 1e-12) : !(e < 1e-10))
    th_fail(__FILE__, __LINE__, "%s D=%d %s: nmse %g against the reference", kn_backend_name(be),
            D, kn_dtype_name(dt), e);
  free(q), free(all), free(rows), free(want);
  cache_free(&c, be);
  kn_backend_destroy(be);
  kn_backend_destroy(ref);
}

/* A key a row does not see never reaches it, not even an infinite V: a causal
 * chunk's rows computed together (tiles that fold a block into rows whose
 * visible keys differ, as the AVX-512 table's do on the diagonal) have the
 * bits of rows computed alone, and the rows before the infinity stay finite. */
static void check_attn_unseen_inf(enum kn_cpu_isa isa, int D, enum kn_dtype dt) {
  struct kn_backend *be = backend_of(isa, 2, 0);
  int len = 40, H = 2, kvh = 1, bad = 20;
  struct kt_cache c;
  cache_init(&c, be, 1, len, kvh, D, 16, dt);
  for (int d = 0; d < D; d++)
    c.v[(size_t)bad * D + d] = d % 3 ? INFINITY : -INFINITY;
  int32_t slot = c.bt[bad / 16] * 16 + bad % 16;
  TH_REQUIRE(
      kn_kv_write(be, &c.view, &slot, c.k + (size_t)bad * D, D, c.v + (size_t)bad * D, D, 1) == 0);
  ptrdiff_t ld = (ptrdiff_t)H * D;
  float *q = kt_rand_f32((size_t)len * ld, 1.0f);
  float *all = malloc(sizeof(float) * (size_t)len * ld),
        *rows = malloc(sizeof(float) * (size_t)len * ld);
  TH_REQUIRE(all && rows);
  struct kn_attn_seq s = seq_of(&c, 0, 0, 0, len);
  TH_REQUIRE(kn_attention(be, all, ld, q, ld, &c.view, &s, 1, H, 0, 0.125f, 0.0f) == 0);
  for (int p = 0; p < len; p++) {
    struct kn_attn_seq one = seq_of(&c, 0, 0, p, 1);
    TH_REQUIRE(kn_attention(be, rows + p * ld, ld, q + p * ld, ld, &c.view, &one, 1, H, 0, 0.125f,
                            0.0f) == 0);
  }
  if (!kt_all_finite(all, (size_t)bad * ld))
    th_fail(__FILE__, __LINE__, "%s D=%d %s: an unseen infinity reached a row", kn_backend_name(be),
            D, kn_dtype_name(dt));
  if (!kt_bits_equal(all, rows, (size_t)len * ld))
    th_fail(__FILE__, __LINE__, "%s D=%d %s: causal rows together differ from rows alone",
            kn_backend_name(be), D, kn_dtype_name(dt));
  free(q), free(all), free(rows);
  cache_free(&c, be);
  kn_backend_destroy(be);
}

TH_TEST(attention_unseen_keys_never_reach_a_row) {
  kt_seed(19);
  check_attn_unseen_inf(kt_vector_isa(), 64, KN_DTYPE_F32);
  check_attn_unseen_inf(kt_vector_isa(), 256, KN_DTYPE_BF16);
  check_attn_unseen_inf(kt_vector_isa(), 72, KN_DTYPE_BF16); /* the 256-bit tiles' */
}

/* A decode row of one kv head on 2 and 3 threads takes its key spans
 * (KN_ATTN_SPAN) on different threads and merges them: the bits of the same
 * row in a prompt attended in one call on one thread (its spans merged inside
 * one walk), at every position (one span, a span's first and last keys, a
 * window or an image across a span's edge), and near the reference. */
static void check_attn_split(enum kn_cpu_isa isa, int D, int H, int kvh, int window,
                             enum kn_dtype dt, float softcap) {
  struct kn_backend *be1 = backend_of(isa, 1, 0), *be2 = backend_of(isa, 2, 0),
                    *be3 = backend_of(isa, 3, 0), *ref = kt_backend(KN_CPU_ISA_REF, 1);
  const int len = 300; /* three spans: 0-127, 128-255, 256-299 */
  struct kt_cache c;
  cache_init(&c, be1, 1, len, kvh, D, 16, dt);
  ptrdiff_t ld = (ptrdiff_t)H * D;
  float *q = kt_rand_f32((size_t)len * ld, 1.0f), *one = malloc(sizeof(float) * (size_t)len * ld);
  float *dec = malloc(sizeof(float) * (size_t)len * ld),
        *want = malloc(sizeof(float) * (size_t)len * ld);
  TH_REQUIRE(q && one && dec && want);
  int32_t range[2] = {100, 140}; /* an image across the span edge at 128 */
  struct kn_attn_seq s = seq_of(&c, 0, 0, 0, len);
  s.bidir = range;
  s.n_bidir = 1;
  TH_REQUIRE(kn_attention(be1, one, ld, q, ld, &c.view, &s, 1, H, window, 0.1f, softcap) == 0);
  TH_REQUIRE(kn_attention(ref, want, ld, q, ld, &c.view, &s, 1, H, window, 0.1f, softcap) == 0);
  for (int p = 0; p < len;) { /* the image's rows as one chunk, as the scheduler sends them */
    struct kn_attn_seq r = s;
    r.pos0 = p;
    r.n_q = p == 100 ? 40 : 1;
    TH_REQUIRE(kn_attention(p & 1 ? be2 : be3, dec + p * ld, ld, q + p * ld, ld, &c.view, &r, 1, H,
                            window, 0.1f, softcap) == 0);
    p += r.n_q;
  }
  if (!kt_bits_equal(dec, one, (size_t)len * ld))
    th_fail(__FILE__, __LINE__,
            "%s D=%d H=%d/%d W=%d %s cap %g: decode rows split over spans differ",
            kn_backend_name(be2), D, H, kvh, window, kn_dtype_name(dt), (double)softcap);
  double e = kt_nmse(one, want, (size_t)len * ld);
  if (!(e < 1e-10))
    th_fail(__FILE__, __LINE__, "%s D=%d W=%d: nmse %g against the reference", kn_backend_name(be2),
            D, window, e);
  free(q), free(one), free(dec), free(want);
  cache_free(&c, be1);
  kn_backend_destroy(be1);
  kn_backend_destroy(be2);
  kn_backend_destroy(be3);
  kn_backend_destroy(ref);
}

TH_TEST(attention_decode_split_over_spans) {
  kt_seed(23);
  check_attn_split(kt_vector_isa(), 64, 4, 1, 0, KN_DTYPE_F32, 0.0f);
  check_attn_split(kt_vector_isa(), 256, 4, 1, 90, KN_DTYPE_BF16, 0.0f);
  check_attn_split(kt_vector_isa(), 128, 4, 1, 0, KN_DTYPE_BF16, 30.0f);
  check_attn_split(KN_CPU_ISA_AVX2, 64, 4, 1, 70, KN_DTYPE_F32, 0.0f);
  /* Gemma 4's groups of 8, and two kv heads (split on 3 threads only) */
  check_attn_split(kt_vector_isa(), 512, 8, 1, 0, KN_DTYPE_BF16, 0.0f);
  check_attn_split(kt_vector_isa(), 64, 16, 2, 50, KN_DTYPE_F32, 0.0f);
}

TH_TEST(attention_tiles_of_an_image) {
  kt_seed(17);
  /* the best table of the default mode here: AVX2's on an AVX2-only processor */
  check_attn_tiles(kt_vector_isa(), 0, 72, KN_DTYPE_F32);
  check_attn_tiles(kt_vector_isa(), 0, 64, KN_DTYPE_BF16);
  check_attn_tiles(kt_vector_isa(), 0, 20, KN_DTYPE_F32); /* not a multiple of 8: reference */
}

TH_TEST(attention_chunking_and_batch_invariant) {
  kt_seed(13);
  check_attn_invariance(kt_vector_isa(), 0, 64, 0, KN_DTYPE_F32);
  check_attn_invariance(kt_vector_isa(), 0, 256, 20, KN_DTYPE_BF16);
  check_attn_invariance(kt_vector_isa(), 0, 512, 0, KN_DTYPE_F32);
  check_attn_invariance(KN_CPU_ISA_REF, 0, 64, 20, KN_DTYPE_F32);
}

/* The bf16 mode on AVX-512-BF16 (kn-cpu-attn-bf16.c; skips, saying so, on
 * processors without): near the f32 reference over the grid's cases (holes,
 * windows, softcap, images, odd blocks, GQA, guard pages), not equal to it
 * (its own kernels ran), and a row's bits the same alone, in tiles, chunked
 * or batched. An f32 cache and head dims that are not multiples of 32 keep
 * the f32 kernels. */
static void check_attn_bf16_mode(enum kn_cpu_isa isa) {
  /* bf first: it may skip the test, which must leave nothing allocated */
  struct kn_backend *bf = backend_of(isa, 2, 1), *ref = kt_backend(KN_CPU_ISA_REF, 2);
  kt_seed(19);
  static const int dims[] = {64, 256, 512, 96, 40};
  static const int gqa[][2] = {{1, 1}, {4, 1}, {8, 2}};
  static const int windows[] = {0, 7};
  for (size_t di = 0; di < CM_ARRAY_LEN(dims); di++)
    for (size_t gi = 0; gi < CM_ARRAY_LEN(gqa); gi++)
      for (size_t wi = 0; wi < CM_ARRAY_LEN(windows); wi++) {
        if (dims[di] == 512 && gqa[gi][0] > 4) continue;
        float cap = wi == 1 && gi == 1 ? 50.0f : 0.0f;
        grid_case(ref, bf, dims[di], gqa[gi][0], gqa[gi][1], windows[wi], (di + gi) % 2 ? 16 : 5,
                  KN_DTYPE_BF16, cap, dims[di] % 32 ? 1e-12 : 1e-4);
      }
  grid_case(ref, bf, 64, 4, 1, 0, 16, KN_DTYPE_F32, 0.0f, 1e-12);
  kn_backend_destroy(ref);
  kn_backend_destroy(bf);
  check_attn_tiles(isa, 1, 64, KN_DTYPE_BF16);
  check_attn_tiles(isa, 1, 256, KN_DTYPE_BF16);
  check_attn_tiles(isa, 1, 64, KN_DTYPE_F32);
  check_attn_tiles(isa, 1, 40, KN_DTYPE_BF16);
  check_attn_invariance(isa, 1, 64, 0, KN_DTYPE_BF16);
  check_attn_invariance(isa, 1, 256, 20, KN_DTYPE_BF16);
  check_attn_invariance(isa, 1, 512, 0, KN_DTYPE_BF16);
}
TH_TEST(attention_bf16_mode) {
  check_attn_bf16_mode(KN_CPU_ISA_AVX512BF16);
}
/* The same on the AMX tiles (kn-cpu-amx.c; skips, saying so, without), and
 * with the tile instructions emulated where the processor has AVX-512-BF16
 * (the kernels' other half). */
TH_TEST(attention_bf16_mode_amx) {
  check_attn_bf16_mode(KN_CPU_ISA_AMX);
}
TH_TEST(attention_bf16_mode_amx_emulated) {
  kt_require_isa(KN_CPU_ISA_AVX512BF16); /* the emulated tiles' attention stands on its table */
  check_attn_bf16_mode(ISA_AMX_EMULATED);
}

/* The check the AMX table must pass before use, run where it can be: the
 * emulated tiles against themselves (a row alone against its tile), and the
 * AVX-512-BF16 kernels against the emulated tiles (the same products summed
 * otherwise: within its tolerance). */
TH_TEST(amx_attention_check) {
  kt_require_isa(KN_CPU_ISA_AVX512BF16); /* the AMX table's attention check */
  const char *why = kn_cpu_amx_check_attention(kn_cpu_amx_attn_tile_emu, kn_cpu_amx_attn_emu);
  if (why) th_fail(__FILE__, __LINE__, "emulated tiles: %s", why);
  why = kn_cpu_amx_check_attention(kn_cpu_attn_tile_bf16, kn_cpu_attn_bf16);
  if (why) th_fail(__FILE__, __LINE__, "AVX-512-BF16 kernels: %s", why);
}

/* ---- bad input ------------------------------------------------------------ */

TH_TEST(attention_bad_tables_are_errors) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_AVX512, 1);
  kt_seed(14);
  struct kt_cache c;
  cache_init(&c, be, 1, 40, 1, 64, 16, KN_DTYPE_F32);
  float q[4 * 64], out[4 * 64];
  memset(q, 0, sizeof(q));
  struct kn_attn_seq s = seq_of(&c, 0, 0, 39, 1);
  TH_CHECK_EQ_INT(kn_attention(be, out, 256, q, 256, &c.view, &s, 1, 4, 0, 1.0f, 0.0f), 0);
  struct kn_kv_view two = c.view;
  two.n_kv_heads = 2; /* 3 query heads cannot share 2 kv heads */
  TH_CHECK_EQ_INT(kn_attention(be, out, 192, q, 192, &two, &s, 1, 3, 0, 1.0f, 0.0f), CM_ERR_SHAPE);
  s.n_blocks = 2; /* position 39 needs block 2 */
  TH_CHECK_EQ_INT(kn_attention(be, out, 256, q, 256, &c.view, &s, 1, 4, 0, 1.0f, 0.0f),
                  CM_ERR_RANGE);
  s.n_blocks = c.n_blocks;
  int32_t saved = c.bt[0];
  c.bt[0] = c.view.n_pages; /* outside the pool */
  TH_CHECK_EQ_INT(kn_attention(be, out, 256, q, 256, &c.view, &s, 1, 4, 0, 1.0f, 0.0f),
                  CM_ERR_RANGE);
  c.bt[0] = -1; /* a hole a full-attention query needs */
  TH_CHECK_EQ_INT(kn_attention(be, out, 256, q, 256, &c.view, &s, 1, 4, 0, 1.0f, 0.0f),
                  CM_ERR_RANGE);
  /* ... but not one a window of 8 leaves behind */
  TH_CHECK_EQ_INT(kn_attention(be, out, 256, q, 256, &c.view, &s, 1, 4, 8, 1.0f, 0.0f), 0);
  c.bt[0] = saved;
  struct kn_kv_view wide = c.view;
  wide.head_dim = 1024;
  TH_CHECK_EQ_INT(kn_attention(be, out, 256, q, 256, &wide, &s, 1, 4, 0, 1.0f, 0.0f),
                  CM_ERR_UNSUPPORTED);
  struct kn_kv_view off = c.view;
  off.k_off = off.page_bytes - 8; /* the layer's block would cross the page */
  TH_CHECK_EQ_INT(kn_attention(be, out, 256, q, 256, &off, &s, 1, 4, 0, 1.0f, 0.0f), CM_ERR_INVAL);
  int32_t bad_range[2] = {30, 20};
  s.bidir = bad_range;
  s.n_bidir = 1;
  TH_CHECK_EQ_INT(kn_attention(be, out, 256, q, 256, &c.view, &s, 1, 4, 0, 1.0f, 0.0f),
                  CM_ERR_INVAL);
  cache_free(&c, be);
  kn_backend_destroy(be);
}

/* Random, mostly malformed descriptors (as a corrupted step plan would carry):
 * every call either succeeds or returns an error, and never reads outside the
 * pool or writes outside the rows it was given (ASan watches the pool, the
 * guards watch the output). */
TH_TEST(attention_random_descriptors_never_escape) {
  struct kn_backend *bes[2] = {kt_backend(KN_CPU_ISA_REF, 2), kt_backend(KN_CPU_ISA_AVX512, 2)};
  kt_seed(15);
  int D = 16, kvh = 1, H = 2, rows = 24;
  struct kt_cache c;
  cache_init(&c, bes[0], 2, 40, kvh, D, 8, KN_DTYPE_F32);
  ptrdiff_t ld = (ptrdiff_t)H * D;
  float *q = kt_rand_f32((size_t)rows * ld, 1.0f);
  float *out = kt_guarded((size_t)rows * ld);
  int32_t tables[2][8], bidir[2][4];
  int ok = 0, errors = 0;
  for (int it = 0; it < 3000; it++) {
    struct kn_attn_seq seqs[2];
    int n_seqs = 1 + kt_int(2);
    for (int s = 0; s < n_seqs; s++) {
      int n_q = kt_int(6);
      seqs[s] = (struct kn_attn_seq){.q_begin = kt_int(rows - n_q + 1) - (kt_int(50) == 0),
                                     .n_q = n_q - (kt_int(50) == 0),
                                     .pos0 = kt_int(70) - (kt_int(50) == 0),
                                     .block_table = tables[s],
                                     .n_blocks = kt_int(9)};
      for (int b = 0; b < 8; b++)
        tables[s][b] = kt_int(3) ? c.bt[b % c.n_blocks] : kt_int(c.view.n_pages + 4) - 2;
      if (kt_int(3) == 0) {
        seqs[s].bidir = bidir[s];
        seqs[s].n_bidir = 1 + kt_int(2);
        for (int i = 0; i < 4; i++)
          bidir[s][i] = kt_int(80) - 5;
      }
    }
    int window = kt_int(4) ? kt_int(40) : -1;
    int rc = kn_attention(bes[it & 1], out, ld, q, ld, &c.view, seqs, n_seqs, H, window, 0.3f,
                          kt_int(4) ? 0.0f : 20.0f);
    if (rc == 0)
      ok++;
    else if (rc == CM_ERR_RANGE || rc == CM_ERR_INVAL)
      errors++;
    else
      th_fail(__FILE__, __LINE__, "unexpected return %d", rc);
    int32_t slots[4];
    for (int i = 0; i < 4; i++)
      slots[i] = kt_int(c.view.n_pages * 8 + 20) - 10;
    rc = kn_kv_write(bes[it & 1], &c.view, slots, q, D, q, D, 4);
    TH_CHECK(rc == 0 || rc == CM_ERR_RANGE);
  }
  TH_CHECK(kt_guards_ok(out, (size_t)rows * ld));
  TH_CHECK(ok > 100 && errors > 100); /* both outcomes were exercised */
  free(q);
  kt_guarded_free(out);
  cache_free(&c, bes[0]);
  kn_backend_destroy(bes[0]);
  kn_backend_destroy(bes[1]);
}

/* ---- an fp8 (e4m3) cache ---------------------------------------------------- */

/* Rewrites c's cache (fp8) with kv head h's scales ks[h] and vs[h] (host; put in
 * backend memory of be, *ks_be / *vs_be, for c->view): raw values 1.7 times c's
 * are written, and c->k / c->v then hold what the cache must read back, the f32
 * product of e4m3(x / scale) and the scale. */
static void rescale_cache(struct kt_cache *c, struct kn_backend *be, const float *ks,
                          const float *vs, float **ks_be, float **vs_be) {
  int kvh = c->view.n_kv_heads, D = c->view.head_dim, len = c->len;
  *ks_be = kn_alloc(be, sizeof(float) * (size_t)kvh);
  *vs_be = kn_alloc(be, sizeof(float) * (size_t)kvh);
  TH_REQUIRE(*ks_be && *vs_be);
  TH_REQUIRE(kn_upload(be, *ks_be, ks, sizeof(float) * (size_t)kvh) == 0);
  TH_REQUIRE(kn_upload(be, *vs_be, vs, sizeof(float) * (size_t)kvh) == 0);
  c->view.k_scale = *ks_be;
  c->view.v_scale = *vs_be;
  size_t row = (size_t)kvh * D, n = (size_t)c->n_seq * len * row;
  for (size_t i = 0; i < n; i++) {
    c->k[i] *= 1.7f;
    c->v[i] *= 1.7f;
  }
  int32_t *slots = malloc(sizeof(int32_t) * (size_t)len);
  TH_REQUIRE(slots);
  for (int s = 0; s < c->n_seq; s++) {
    for (int p = 0; p < len; p++)
      slots[p] = c->bt[s * c->n_blocks + p / c->view.block_tokens] * c->view.block_tokens +
                 p % c->view.block_tokens;
    TH_REQUIRE(kn_kv_write(be, &c->view, slots, c->k + (size_t)s * len * row, (ptrdiff_t)row,
                           c->v + (size_t)s * len * row, (ptrdiff_t)row, len) == 0);
  }
  free(slots);
  for (size_t i = 0; i < n; i++) {
    int h = (int)(i % row) / D;
    c->k[i] = kn_f8e4m3_to_f32(kn_f32_to_f8e4m3(c->k[i] / ks[h])) * ks[h];
    c->v[i] = kn_f8e4m3_to_f32(kn_f32_to_f8e4m3(c->v[i] / vs[h])) * vs[h];
  }
}

/* Attention over an fp8 cache is attention over an f32 cache holding the same
 * values, bit for bit, on each table (every kernel widens the cache exactly as
 * it loads it), in the default and the bf16 mode; kv_write rounded what it
 * stored as kn_f32_to_f8e4m3 does (cache_init's copies). With scales (a
 * checkpoint's k_scale / v_scale, one per kv head), the cache holds each value
 * divided by its head's scale and reads back the e4m3 value times the scale. */
static void check_fp8_cache(int scaled) {
  kt_seed(23);
  static const int dims[] = {64, 256, 40};
  for (size_t di = 0; di < CM_ARRAY_LEN(dims); di++)
    for (int window = 0; window <= 9; window += 9) {
      int D = dims[di], H = 4, kvh = 2, len = 53, n_seq = 2;
      struct kn_backend *ref = kt_backend(KN_CPU_ISA_REF, 1), *vec = kt_backend(kt_vector_isa(), 2);
      struct kn_backend *bf = NULL;
      TH_REQUIRE(kn_cpu_backend_create_mode(2, KN_CPU_ISA_BEST, 1, &bf) == 0 && bf);
      struct kt_cache c8, c32;
      cache_init(&c8, vec, n_seq, len, kvh, D, 16, KN_DTYPE_F8E4M3);
      /* scales of both kinds: powers of two and others, above and below 1 */
      static const float ks[2] = {4.0f, 0.37f}, vs[2] = {0.125f, 2.6f};
      float *ks_be = NULL, *vs_be = NULL;
      if (scaled) rescale_cache(&c8, vec, ks, vs, &ks_be, &vs_be);
      /* the same pages in f32, holding the values the fp8 cache reads back */
      c32 = c8;
      c32.view.k_scale = c32.view.v_scale = NULL;
      c32.view.page_bytes = c8.view.page_bytes * 4;
      c32.view.k_off = c8.view.k_off * 4;
      c32.view.v_off = c8.view.v_off * 4;
      c32.view.dtype = KN_DTYPE_F32;
      c32.view.pool = kn_alloc(ref, (size_t)c32.view.n_pages * c32.view.page_bytes);
      TH_REQUIRE(c32.view.pool);
      int32_t *slots = malloc(sizeof(int32_t) * (size_t)len);
      TH_REQUIRE(slots);
      size_t row = (size_t)kvh * D;
      for (int s = 0; s < n_seq; s++) {
        for (int p = 0; p < len; p++)
          slots[p] = c8.bt[s * c8.n_blocks + p / 16] * 16 + p % 16;
        TH_REQUIRE(kn_kv_write(ref, &c32.view, slots, c8.k + (size_t)s * len * row, (ptrdiff_t)row,
                               c8.v + (size_t)s * len * row, (ptrdiff_t)row, len) == 0);
      }
      ptrdiff_t ld = (ptrdiff_t)H * D;
      float *q = kt_rand_f32((size_t)len * ld * 2, 1.0f);
      float *want = malloc(sizeof(float) * (size_t)len * ld * 2);
      float *got = malloc(sizeof(float) * (size_t)len * ld * 2);
      TH_REQUIRE(want && got);
      struct kn_attn_seq s32[2] = {seq_of(&c32, 0, 0, 0, len), seq_of(&c32, 1, len, 20, len - 20)};
      struct kn_attn_seq s8[2] = {seq_of(&c8, 0, 0, 0, len), seq_of(&c8, 1, len, 20, len - 20)};
      /* the bf16 mode keeps an fp8 cache on the default table's kernels */
      struct kn_backend *bes[3] = {ref, vec, bf}, *same[3] = {ref, vec, vec};
      for (int b = 0; b < 3; b++) {
        TH_REQUIRE(kn_attention(same[b], want, ld, q, ld, &c32.view, s32, 2, H, window, 0.125f,
                                0.0f) == 0);
        memset(got, 0, sizeof(float) * (size_t)len * ld * 2);
        TH_REQUIRE(kn_attention(bes[b], got, ld, q, ld, &c8.view, s8, 2, H, window, 0.125f, 0.0f) ==
                   0);
        if (!kt_bits_equal(got, want, (size_t)(2 * len - 20) * ld))
          th_fail(__FILE__, __LINE__, "%s D=%d window %d: the fp8 cache's attention differs",
                  kn_backend_name(bes[b]), D, window);
      }
      free(q), free(want), free(got), free(slots);
      kn_free(ref, c32.view.pool);
      kn_free(vec, ks_be), kn_free(vec, vs_be);
      cache_free(&c8, vec);
      kn_backend_destroy(ref);
      kn_backend_destroy(vec);
      kn_backend_destroy(bf);
    }
}

TH_TEST(attention_over_an_fp8_cache) {
  check_fp8_cache(0);
}

TH_TEST(attention_over_an_fp8_cache_with_scales) {
  check_fp8_cache(1);
}

/* Scales belong to an fp8 cache: with another dtype the view is refused. */
TH_TEST(kv_scales_need_an_fp8_cache) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_REF, 1);
  struct kt_cache c;
  cache_init(&c, be, 1, 8, 2, 64, 16, KN_DTYPE_BF16);
  static const float one[2] = {1.0f, 1.0f};
  c.view.k_scale = one;
  int32_t slot = c.bt[0] * 16;
  TH_CHECK_EQ_INT(kn_kv_write(be, &c.view, &slot, c.k, 128, c.v, 128, 1), CM_ERR_INVAL);
  cache_free(&c, be);
  kn_backend_destroy(be);
}
