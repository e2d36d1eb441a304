/* test-cuda-attn.c — the CUDA backend's paged KV cache against the CPU
 * oracle: kv_write (f32 / bf16 pages, skipped slots, K-only) compared byte
 * for byte, and attention over a grid of ragged batches mixing prefill
 * chunks and decodes — head dims 8..512, GQA ratios 1..16, sliding windows,
 * softcap, bidirectional ranges, shuffled pages with holes in the block
 * tables, contexts long enough to split the keys. Skips loudly without a
 * device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "kernels/kn-backend.h"
#include "tests/harness/th.h"
#include "tests/unit/cuda/cuda-test-util.h"

/* ---- kv_write ------------------------------------------------------------ */

TH_TEST(cuda_kv_write) {
  struct ct_env e;
  ct_open(&e, 20);
  const int kvs[] = {1, 4}, Ds[] = {64, 256, 512};
  /* fp8: the device's __NV_SATFINITE conversion against kn_f32_to_f8e4m3, byte for byte */
  /* the fourth: fp8 with a scale per kv head (each value divided by it first):
   * K's scales are scales[0 .. kv), V's scales[4 .. 4 + kv) */
  const enum kn_dtype dts[] = {KN_DTYPE_F32, KN_DTYPE_BF16, KN_DTYPE_F8E4M3, KN_DTYPE_F8E4M3};
  const float scales[8] = {0.37f, 4.0f, 2.6f, 0.125f, 1.7f, 0.06f, 3.1f, 0.9f};
  float *scales_d = ct_up(&e, scales, sizeof(scales));
  for (size_t ki = 0; ki < 2; ki++)
    for (size_t di = 0; di < 3; di++)
      for (size_t ti = 0; ti < 4; ti++)
        for (int k_only = 0; k_only < 2; k_only++) {
          struct kn_kv_view v = {0};
          v.n_pages = 12;
          v.block_tokens = 16;
          v.n_kv_heads = kvs[ki];
          v.head_dim = Ds[di];
          v.dtype = dts[ti];
          int scaled = ti == 3;
          size_t blk = (size_t)v.block_tokens * v.n_kv_heads * v.head_dim * kn_dtype_size(v.dtype);
          v.k_off = 2 * blk; /* layer 1 of a two-layer page */
          v.v_off = 3 * blk;
          v.page_bytes = 4 * blk + 256;
          size_t pool_bytes = (size_t)v.n_pages * v.page_bytes;
          unsigned char *pool = malloc(pool_bytes), *got = malloc(pool_bytes);
          TH_REQUIRE(pool && got);
          memset(pool, 0x5a, pool_bytes);
          void *pool_d = ct_up(&e, pool, pool_bytes);
          enum { T = 40 };
          int row = v.n_kv_heads * v.head_dim;
          ptrdiff_t ld = row + 5;
          float *k = malloc((size_t)T * ld * sizeof(float)),
                *vv = malloc((size_t)T * ld * sizeof(float));
          TH_REQUIRE(k && vv);
          ct_fill(&e, k, (size_t)T * ld, 3.0f);
          ct_fill(&e, vv, (size_t)T * ld, 3.0f);
          int32_t slots[T];
          int n_slots = v.n_pages * v.block_tokens;
          /* distinct slots (two tokens on one slot race on the device): 37 is
           * prime to n_slots - 1 = 191, and the last slot of the pool is left
           * to the last token */
          for (int t = 0; t < T; t++)
            slots[t] = (t * 37 + 11) % (n_slots - 1);
          slots[3] = -1;
          slots[17] = -5;
          slots[T - 1] = n_slots - 1;
          float *k_d = ct_up(&e, k, (size_t)T * ld * sizeof(float));
          float *v_d = ct_up(&e, vv, (size_t)T * ld * sizeof(float));
          v.pool = pool;
          v.k_scale = scaled ? scales : NULL;
          v.v_scale = scaled ? scales + 4 : NULL;
          TH_CHECK(kn_kv_write(e.cpu, &v, slots, k, ld, k_only ? NULL : vv, ld, T) == 0);
          v.pool = pool_d;
          v.k_scale = scaled ? scales_d : NULL;
          v.v_scale = scaled ? scales_d + 4 : NULL;
          TH_CHECK(kn_kv_write(e.gpu, &v, slots, k_d, ld, k_only ? NULL : v_d, ld, T) == 0);
          /* a slot past the pool is refused before anything is written */
          slots[5] = n_slots;
          TH_CHECK_EQ_INT(kn_kv_write(e.gpu, &v, slots, k_d, ld, v_d, ld, T), CM_ERR_RANGE);
          ct_down(&e, got, pool_d, pool_bytes);
          size_t diff = 0;
          for (size_t i = 0; i < pool_bytes; i++)
            diff += pool[i] != got[i];
          if (diff)
            th_fail(__FILE__, __LINE__, "kv_write kv=%d D=%d %s%s k_only=%d: %zu bytes differ",
                    v.n_kv_heads, v.head_dim, kn_dtype_name(v.dtype), scaled ? " scaled" : "",
                    k_only, diff);
          kn_free(e.gpu, pool_d);
          kn_free(e.gpu, k_d);
          kn_free(e.gpu, v_d);
          free(pool);
          free(got);
          free(k);
          free(vv);
        }
  kn_free(e.gpu, scales_d);
  ct_close(&e);
}

/* ---- attention ----------------------------------------------------------- */

struct seq_spec {
  int n_q, pos0;
  int n_bidir;
  int bidir[4]; /* up to two [begin, end) ranges */
};

struct attn_case {
  const char *name;
  int D, n_heads, n_kv, bt;
  enum kn_dtype dt;
  int window;
  float softcap;
  int n_seqs;
  struct seq_spec seqs[8];
  int scaled; /* fp8: a scale per kv head (k_scale, v_scale) */
};

/* clang-format off */
static const struct attn_case k_cases[] = {
  {"small mha f32", 64, 4, 4, 16, KN_DTYPE_F32, 0, 0.0f, 3, {{1, 10}, {20, 0}, {1, 100}}},
  {"d256 gqa2 window bf16 softcap", 256, 8, 4, 16, KN_DTYPE_BF16, 32, 50.0f, 3,
   {{1, 300}, {1, 17}, {37, 60}}},
  {"d512 gqa8 bf16", 512, 16, 2, 8, KN_DTYPE_BF16, 0, 0.0f, 2, {{13, 5}, {1, 200}}},
  {"d128 gqa16 window f32", 128, 32, 2, 16, KN_DTYPE_F32, 64, 0.0f, 2, {{1, 500}, {9, 40}}},
  {"long decodes split-k f32", 256, 8, 1, 16, KN_DTYPE_F32, 0, 0.0f, 3,
   {{1, 6000}, {1, 3000}, {1, 5}}},
  {"bidirectional ranges", 64, 4, 2, 16, KN_DTYPE_F32, 0, 0.0f, 2,
   {{24, 0, 2, {4, 12, 16, 20}}, {8, 8, 1, {4, 12}}}},
  {"bidirectional with window bf16", 128, 4, 1, 8, KN_DTYPE_BF16, 8, 0.0f, 1,
   {{30, 0, 1, {2, 25}}}},
  {"d512 window 1024 long bf16", 512, 8, 2, 16, KN_DTYPE_BF16, 1024, 0.0f, 3,
   {{1, 3000}, {1, 1500}, {64, 2900}}},
  {"ragged mix bf16 softcap", 256, 16, 8, 16, KN_DTYPE_BF16, 0, 30.0f, 8,
   {{1, 0}, {1, 1}, {1, 15}, {1, 16}, {1, 777}, {1, 2049}, {50, 100}, {16, 0}}},
  {"tiny dims", 8, 2, 1, 4, KN_DTYPE_F32, 0, 0.0f, 2, {{5, 0}, {1, 9}}},
  {"odd head dim window bf16", 80, 6, 3, 16, KN_DTYPE_BF16, 20, 0.0f, 2, {{30, 10}, {1, 90}}},
  {"d384 mqa f32", 384, 4, 1, 16, KN_DTYPE_F32, 0, 0.0f, 2, {{3, 50}, {1, 33}}},
  /* decode-only batches: blocks carry just the group's heads (1, 2, 4 or 8 slots) */
  {"decodes gqa2 window 1024 bf16", 256, 8, 4, 16, KN_DTYPE_BF16, 1024, 0.0f, 4,
   {{1, 5000}, {1, 40}, {1, 1023}, {1, 1024}}},
  {"decodes mha f32", 128, 4, 4, 16, KN_DTYPE_F32, 0, 0.0f, 2, {{1, 300}, {1, 0}}},
  {"decodes gqa4 d512 bf16", 512, 8, 2, 16, KN_DTYPE_BF16, 0, 0.0f, 2, {{1, 2000}, {1, 100}}},
  {"decodes gqa6 softcap f32", 64, 12, 2, 16, KN_DTYPE_F32, 0, 20.0f, 2, {{1, 700}, {1, 3}}},
  /* an fp8 (e4m3) cache: the same bytes on both sides, read and widened exactly */
  {"d256 gqa2 window fp8", 256, 8, 4, 16, KN_DTYPE_F8E4M3, 32, 0.0f, 3,
   {{1, 300}, {1, 17}, {37, 60}}},
  {"decodes gqa4 d512 fp8 split-k", 512, 8, 2, 16, KN_DTYPE_F8E4M3, 0, 0.0f, 2,
   {{1, 2000}, {1, 100}}},
  /* and with the checkpoint's scales: values read back as e4m3 value * scale */
  {"d256 gqa2 window fp8 scaled", 256, 8, 4, 16, KN_DTYPE_F8E4M3, 32, 0.0f, 3,
   {{1, 300}, {1, 17}, {37, 60}}, 1},
  {"decodes gqa4 d512 fp8 split-k scaled", 512, 8, 2, 16, KN_DTYPE_F8E4M3, 0, 0.0f, 2,
   {{1, 2000}, {1, 100}}, 1},
};
/* clang-format on */

/* Highest key position seq s can reach (its queries' causal and bidir keys). */
static int seq_max_key(const struct seq_spec *s) {
  int hi = s->pos0 + s->n_q - 1;
  for (int r = 0; r < s->n_bidir; r++)
    if (s->bidir[2 * r + 1] - 1 > hi) hi = s->bidir[2 * r + 1] - 1;
  return hi;
}

static void attn_case_run(struct ct_env *e, const struct attn_case *c) {
  struct kn_kv_view v = {0};
  v.block_tokens = c->bt;
  v.n_kv_heads = c->n_kv;
  v.head_dim = c->D;
  v.dtype = c->dt;
  size_t elt = kn_dtype_size(c->dt);
  size_t blk = (size_t)c->bt * c->n_kv * c->D * elt;
  v.k_off = 2 * blk; /* layer 1 of a two-layer page */
  v.v_off = 3 * blk;
  v.page_bytes = 4 * blk + 256;

  /* block tables over a shuffled pool, one spare entry past the end (-1) */
  int n_blocks[8], total_blocks = 0;
  for (int i = 0; i < c->n_seqs; i++) {
    n_blocks[i] = seq_max_key(&c->seqs[i]) / c->bt + 2;
    total_blocks += n_blocks[i];
  }
  v.n_pages = total_blocks + 3;
  int32_t *perm = malloc((size_t)v.n_pages * sizeof(int32_t));
  int32_t *tables = malloc((size_t)total_blocks * sizeof(int32_t));
  TH_REQUIRE(perm && tables);
  for (int i = 0; i < v.n_pages; i++)
    perm[i] = i;
  for (int i = v.n_pages - 1; i > 0; i--) {
    int j = ct_rand_int(e, i + 1);
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  struct kn_attn_seq seqs[8];
  int off = 0, rows = 0;
  for (int i = 0; i < c->n_seqs; i++) {
    const struct seq_spec *s = &c->seqs[i];
    int32_t *bt = tables + off;
    for (int b = 0; b < n_blocks[i]; b++)
      bt[b] = perm[off + b];
    bt[n_blocks[i] - 1] = -1; /* past every key: never read */
    if (c->window > 0 && s->n_bidir == 0) {
      /* blocks wholly before the first query's window are freed: holes */
      int first = s->pos0 - c->window + 1;
      for (int b = 0; (b + 1) * c->bt - 1 < first; b++)
        bt[b] = -1;
    }
    seqs[i].q_begin = rows;
    seqs[i].n_q = s->n_q;
    seqs[i].pos0 = s->pos0;
    seqs[i].block_table = bt;
    seqs[i].n_blocks = n_blocks[i];
    seqs[i].bidir = s->n_bidir ? s->bidir : NULL;
    seqs[i].n_bidir = s->n_bidir;
    rows += s->n_q + 1; /* a gap row no sequence covers: must stay untouched */
    off += n_blocks[i];
  }

  size_t pool_bytes = (size_t)v.n_pages * v.page_bytes;
  unsigned char *pool = malloc(pool_bytes);
  TH_REQUIRE(pool);
  size_t n_elt = pool_bytes / elt;
  for (size_t i = 0; i < n_elt; i++)
    kn_store_f32(pool, c->dt, i, ct_rand(e, 1.0f));
  int width = c->n_heads * c->D;
  ptrdiff_t ldq = width + 8, ldo = width + 4;
  size_t tq = (size_t)rows * ldq, to = (size_t)rows * ldo;
  float *q = malloc(tq * sizeof(float));
  TH_REQUIRE(q);
  ct_fill(e, q, tq, 1.0f);
  struct ct_out o;
  ct_out_init(e, &o, to, 0);
  float scale = 1.0f / sqrtf((float)c->D) * 2.0f;

  void *pool_d = ct_up(e, pool, pool_bytes);
  float *q_d = ct_up(e, q, tq * sizeof(float));
  float sc[16]; /* k_scale then v_scale: powers of two and others */
  for (int h = 0; h < 2 * c->n_kv && h < 16; h++)
    sc[h] = h % 3 == 0 ? 0.25f : 0.3f + 0.9f * (float)h;
  float *sc_d = c->scaled ? ct_up(e, sc, sizeof(sc)) : NULL;
  v.pool = pool;
  v.k_scale = c->scaled ? sc : NULL;
  v.v_scale = c->scaled ? sc + c->n_kv : NULL;
  int rc_cpu = kn_attention(e->cpu, o.ref, ldo, q, ldq, &v, seqs, c->n_seqs, c->n_heads, c->window,
                            scale, c->softcap);
  v.pool = pool_d;
  v.k_scale = sc_d;
  v.v_scale = sc_d ? sc_d + c->n_kv : NULL;
  int rc_gpu = kn_attention(e->gpu, o.dev, ldo, q_d, ldq, &v, seqs, c->n_seqs, c->n_heads,
                            c->window, scale, c->softcap);
  kn_free(e->gpu, sc_d);
  if (rc_cpu || rc_gpu)
    th_fail(__FILE__, __LINE__, "attention %s: cpu %d, cuda %d", c->name, rc_cpu, rc_gpu);
  ct_out_check(e, &o, rows, width, ldo, 1e-9, "attention %s", c->name);

  kn_free(e->gpu, pool_d);
  kn_free(e->gpu, q_d);
  free(pool);
  free(q);
  free(perm);
  free(tables);
}

TH_TEST(cuda_attention) {
  struct ct_env e;
  ct_open(&e, 21);
  for (size_t i = 0; i < CM_ARRAY_LEN(k_cases); i++)
    attn_case_run(&e, &k_cases[i]);
  ct_close(&e);
}

/* Bad block tables (a page outside the pool, a missing entry) and
 * misaligned views are refused with an error code and leave the stream
 * usable; the same call with a good table then runs. */
TH_TEST(cuda_attention_rejects_missing_page) {
  struct ct_env e;
  ct_open(&e, 22);
  struct kn_kv_view v = {0};
  v.block_tokens = 16;
  v.n_kv_heads = 1;
  v.head_dim = 64;
  v.dtype = KN_DTYPE_F32;
  v.n_pages = 4;
  v.k_off = 0;
  v.v_off = 16 * 64 * 4;
  v.page_bytes = 2 * v.v_off;
  v.pool = kn_alloc(e.gpu, (size_t)v.n_pages * v.page_bytes);
  float *q = kn_alloc(e.gpu, 2 * 64 * sizeof(float)),
        *out = kn_alloc(e.gpu, 2 * 64 * sizeof(float));
  TH_REQUIRE(v.pool && q && out);
  int32_t table[2] = {1, 7}; /* page 7 is outside the pool */
  struct kn_attn_seq s = {0, 1, 20, table, 2, NULL, 0};
  TH_CHECK_EQ_INT(kn_attention(e.gpu, out, 64, q, 64, &v, &s, 1, 1, 0, 1.0f, 0.0f), CM_ERR_RANGE);
  table[1] = -1;
  TH_CHECK_EQ_INT(kn_attention(e.gpu, out, 64, q, 64, &v, &s, 1, 1, 0, 1.0f, 0.0f), CM_ERR_RANGE);
  table[1] = 2;
  /* an f32 view whose offsets are not whole floats is refused, not run */
  struct kn_kv_view odd = v;
  odd.k_off = 2;
  int32_t slot0 = 0;
  TH_CHECK_EQ_INT(kn_attention(e.gpu, out, 64, q, 64, &odd, &s, 1, 1, 0, 1.0f, 0.0f), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_kv_write(e.gpu, &odd, &slot0, q, 64, q, 64, 1), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_memset(e.gpu, v.pool, 0, (size_t)v.n_pages * v.page_bytes), 0);
  TH_CHECK_EQ_INT(kn_memset(e.gpu, q, 0, 2 * 64 * sizeof(float)), 0);
  TH_CHECK_EQ_INT(kn_attention(e.gpu, out, 64, q, 64, &v, &s, 1, 1, 0, 1.0f, 0.0f), 0);
  float back[64];
  ct_down(&e, back, out, sizeof(back));
  int bad = 0;
  for (int i = 0; i < 64; i++)
    bad += back[i] != 0.0f; /* zero V averaged: zero */
  TH_CHECK_EQ_INT(bad, 0);
  kn_free(e.gpu, v.pool);
  kn_free(e.gpu, q);
  kn_free(e.gpu, out);
  ct_close(&e);
}
