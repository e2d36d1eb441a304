/* test-kn-fused.c — the fused ops (kn-backend.h) against the unfused ops
 * they stand for, called one by one here: the same bits on every CPU table
 * and in the bf16 mode, for odd shapes, strided rows (a tensor-parallel
 * rank's slices), every norm mode and weight dtype (FP8 weights with their
 * scales on every kernel table), layers with and without K/V; bad arguments
 * (an FP8 scale missing or one given to other weights) are errors; a
 * backend's fused op that declines a call leaves it to the sequence; and
 * kn_fused_check finds a fused op that is wrong. */
#include <math.h>
#include <stdio.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-quant.h"
#include "tests/unit/kernels/kn-test-util.h"

static const enum kn_dtype wdts[] = {KN_DTYPE_F32, KN_DTYPE_BF16, KN_DTYPE_F16};

/* The CPU backends a test runs on: the reference, the best vector table here,
 * and the bf16 mode on the best table (callers destroy them). */
static int backends(struct kn_backend *be[3]) {
  be[0] = kt_backend(KN_CPU_ISA_REF, 1);
  be[1] = kt_backend(kt_vector_isa(), 2);
  be[2] = NULL;
  TH_REQUIRE(kn_cpu_backend_create_mode(2, KN_CPU_ISA_BEST, 1, &be[2]) == 0 && be[2]);
  return 3;
}

static float *dup_f32(const float *a, size_t n) {
  float *b = malloc(sizeof(float) * n);
  TH_REQUIRE(b);
  memcpy(b, a, sizeof(float) * n);
  return b;
}

/* ---- add + norm ------------------------------------------------------------ */

static void check_add_norm(struct kn_backend *be, int T, int H, ptrdiff_t ld, enum kn_dtype wdt,
                           enum kn_norm_mode mode, float scale, int with_h) {
  size_t n = (size_t)T * (size_t)ld;
  float *x = kt_rand_f32(n, 3.0f), *o = kt_rand_f32(n, 1.0f), *h = kt_rand_f32(n, 1.0f);
  void *pw = kt_rand_tensor(wdt, (size_t)H, 1.0f), *nw = kt_rand_tensor(wdt, (size_t)H, 1.0f);
  float *x2 = dup_f32(x, n), *o2 = dup_f32(o, n), *h2 = dup_f32(h, n);
  const float eps = 1e-6f;
  TH_REQUIRE(kn_add_norm(be, x, ld, o, ld, with_h ? h : NULL, ld, T, H, pw, nw, wdt, scale, eps,
                         mode) == 0);
  /* the unfused ops, row by row */
  for (int t = 0; t < T; t++) {
    float *xr = x2 + (size_t)t * ld, *orow = o2 + (size_t)t * ld;
    TH_REQUIRE(kn_rmsnorm(be, orow, H, orow, H, 1, H, pw, wdt, eps, mode) == 0);
    TH_REQUIRE(kn_add(be, xr, xr, orow, (size_t)H) == 0);
    TH_REQUIRE(kn_scale(be, xr, xr, scale, (size_t)H) == 0);
    if (with_h)
      TH_REQUIRE(kn_rmsnorm(be, h2 + (size_t)t * ld, H, xr, H, 1, H, nw, wdt, eps, mode) == 0);
  }
  if (!kt_bits_equal(x, x2, n) || !kt_bits_equal(h, h2, n))
    th_fail(__FILE__, __LINE__, "%s T=%d H=%d ld=%d %s mode %d scale %g h %d: differs",
            kn_backend_name(be), T, H, (int)ld, kn_dtype_name(wdt), (int)mode, scale, with_h);
  free(x), free(o), free(h), free(x2), free(o2), free(h2), free(pw), free(nw);
}

TH_TEST(add_norm_is_norm_add_scale_norm) {
  struct kn_backend *be[3];
  int n = backends(be);
  kt_seed(31);
  static const enum kn_norm_mode modes[] = {KN_NORM_MUL_W, KN_NORM_MUL_ONE_PLUS_W, KN_NORM_NO_W};
  for (int b = 0; b < n; b++)
    for (int m = 0; m < 3; m++)
      for (int d = 0; d < 3; d++) {
        check_add_norm(be[b], 1, 1152, 1152, wdts[d], modes[m], 1.0f, 1);
        check_add_norm(be[b], 7, 37, 37, wdts[d], modes[m], 0.37f, 1);
        check_add_norm(be[b], 40, 640, 656, wdts[d], modes[m], 1.0f, m != 2);
        check_add_norm(be[b], 3, 2560, 2560, wdts[d], modes[m], 2.5f, 0);
      }
  for (int b = 0; b < n; b++)
    kn_backend_destroy(be[b]);
}

/* ---- q/k norm, RoPE, KV write ---------------------------------------------- */

static void check_qkv_prep(struct kn_backend *be, int T, int nh, int kvh, int D, enum kn_dtype kvdt,
                           int with_kv, int v_norm, enum kn_norm_mode mode, int pad) {
  const int bt = 16, pos0 = 29;
  int n_pages = (pos0 + T) / bt + 4;
  size_t blk = (size_t)bt * kvh * D * kn_dtype_size(kvdt);
  struct kn_kv_view view = {.page_bytes = 2 * blk + 128,
                            .n_pages = n_pages,
                            .k_off = 64,
                            .v_off = blk + 128,
                            .block_tokens = bt,
                            .n_kv_heads = kvh,
                            .head_dim = D,
                            .dtype = kvdt};
  size_t pool = (size_t)n_pages * view.page_bytes;
  ptrdiff_t ldq = (ptrdiff_t)nh * D + pad, ldk = (ptrdiff_t)kvh * D + pad;
  float *q = kt_rand_f32((size_t)T * ldq, 4.0f), *k = kt_rand_f32((size_t)T * ldk, 4.0f);
  float *v = kt_rand_f32((size_t)T * ldk, 4.0f);
  float *q2 = dup_f32(q, (size_t)T * ldq), *k2 = dup_f32(k, (size_t)T * ldk);
  float *v2 = dup_f32(v, (size_t)T * ldk);
  float *qw = kt_rand_f32((size_t)D, 1.0f), *kw = kt_rand_f32((size_t)D, 1.0f);
  float *freq = malloc(sizeof(float) * (size_t)D / 2);
  unsigned char *p1 = malloc(pool), *p2 = malloc(pool);
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)T), *slots = malloc(sizeof(int32_t) * (size_t)T);
  TH_REQUIRE(freq && p1 && p2 && pos && slots);
  for (int i = 0; i < D / 2; i++) /* the last pairs unrotated: partial RoPE */
    freq[i] = i < D / 3 ? powf(10000.0f, -2.0f * (float)i / (float)D) : 0.0f;
  memset(p1, 0x5a, pool);
  memset(p2, 0x5a, pool);
  for (int t = 0; t < T; t++) {
    int p = pos0 + t;
    pos[t] = p;
    slots[t] = t % 5 == 3 ? -1 : (n_pages - 1 - p / bt) * bt + p % bt;
  }
  view.pool = p1;
  struct kn_qkv_prep_args pr = {.q = q,
                                .ldq = ldq,
                                .n_heads = nh,
                                .k = with_kv ? k : NULL,
                                .v = with_kv ? v : NULL,
                                .ldk = ldk,
                                .ldv = ldk,
                                .q_w = qw,
                                .k_w = kw,
                                .wdt = KN_DTYPE_F32,
                                .eps = 1e-6f,
                                .mode = mode,
                                .v_norm = v_norm,
                                .pos = pos,
                                .inv_freq = freq,
                                .view = &view,
                                .slots = slots};
  TH_REQUIRE(kn_qkv_prep(be, &pr, T) == 0);
  /* the unfused ops a token at a time */
  struct kn_kv_view view2 = view;
  view2.pool = p2;
  for (int t = 0; t < T; t++) {
    float *qt = q2 + (size_t)t * ldq, *kt = k2 + (size_t)t * ldk, *vt = v2 + (size_t)t * ldk;
    TH_REQUIRE(kn_rmsnorm(be, qt, D, qt, D, nh, D, qw, KN_DTYPE_F32, 1e-6f, mode) == 0);
    TH_REQUIRE(kn_rope(be, qt, ldq, 1, nh, D, pos + t, freq) == 0);
    if (!with_kv) continue;
    TH_REQUIRE(kn_rmsnorm(be, kt, D, kt, D, kvh, D, kw, KN_DTYPE_F32, 1e-6f, mode) == 0);
    TH_REQUIRE(kn_rope(be, kt, ldk, 1, kvh, D, pos + t, freq) == 0);
    if (v_norm)
      TH_REQUIRE(kn_rmsnorm(be, vt, D, vt, D, kvh, D, NULL, KN_DTYPE_F32, 1e-6f, KN_NORM_NO_W) ==
                 0);
    TH_REQUIRE(kn_kv_write(be, &view2, slots + t, kt, ldk, vt, ldk, 1) == 0);
  }
  if (!kt_bits_equal(q, q2, (size_t)T * ldq) || memcmp(p1, p2, pool))
    th_fail(__FILE__, __LINE__, "%s T=%d heads %d/%d D=%d %s kv %d vnorm %d pad %d: differs",
            kn_backend_name(be), T, nh, kvh, D, kn_dtype_name(kvdt), with_kv, v_norm, pad);
  free(q), free(k), free(v), free(q2), free(k2), free(v2), free(qw), free(kw), free(freq);
  free(p1), free(p2), free(pos), free(slots);
}

TH_TEST(qkv_prep_is_norm_rope_kv_write) {
  struct kn_backend *be[3];
  int n = backends(be);
  kt_seed(32);
  for (int b = 0; b < n; b++) {
    check_qkv_prep(be[b], 1, 8, 2, 256, KN_DTYPE_BF16, 1, 1, KN_NORM_MUL_W, 0);
    check_qkv_prep(be[b], 11, 4, 1, 64, KN_DTYPE_F32, 1, 0, KN_NORM_MUL_ONE_PLUS_W, 0);
    check_qkv_prep(be[b], 9, 6, 3, 40, KN_DTYPE_BF16, 1, 1, KN_NORM_MUL_W, 8);
    check_qkv_prep(be[b], 4, 4, 2, 512, KN_DTYPE_BF16, 0, 1, KN_NORM_MUL_W, 0);
    check_qkv_prep(be[b], 20, 2, 2, 128, KN_DTYPE_F32, 1, 1, KN_NORM_MUL_W, 3);
  }
  for (int b = 0; b < n; b++)
    kn_backend_destroy(be[b]);
}

/* ---- matmuls of one input ---------------------------------------------------- */

TH_TEST(matmul_n_and_glu_are_their_matmuls) {
  struct kn_backend *be[3];
  int n = backends(be);
  kt_seed(33);
  static const int Ts[] = {1, 3, 8, 17}, Ks[] = {64, 100};
  for (int b = 0; b < n; b++)
    for (size_t d = 0; d < CM_ARRAY_LEN(wdts); d++)
      for (size_t ti = 0; ti < CM_ARRAY_LEN(Ts); ti++)
        for (size_t ki = 0; ki < CM_ARRAY_LEN(Ks); ki++) {
          int T = Ts[ti], K = Ks[ki], N[3] = {48, 17, 16}, ld = 96; /* one strided output */
          float *in = kt_rand_f32((size_t)T * K, 1.0f);
          void *w[3];
          float *got[3], *want[3];
          struct kn_mm_part parts[3];
          for (int i = 0; i < 3; i++) {
            w[i] = kt_rand_tensor(wdts[d], (size_t)N[i] * K, 0.5f);
            int ldo = i == 0 ? ld : N[i];
            got[i] = kt_rand_f32((size_t)T * ldo, 1.0f);
            want[i] = dup_f32(got[i], (size_t)T * ldo);
            parts[i] = (struct kn_mm_part){got[i], ldo, w[i], N[i]};
            TH_REQUIRE(kn_matmul(be[b], want[i], ldo, in, K, w[i], wdts[d], T, N[i], K, 0) == 0);
          }
          TH_REQUIRE(kn_matmul_n(be[b], in, K, wdts[d], T, K, parts, 3) == 0);
          for (int i = 0; i < 3; i++)
            if (!kt_bits_equal(got[i], want[i], (size_t)T * (i == 0 ? ld : N[i])))
              th_fail(__FILE__, __LINE__, "%s matmul_n part %d T=%d K=%d %s differs",
                      kn_backend_name(be[b]), i, T, K, kn_dtype_name(wdts[d]));
          /* glu over parts 1 and 2's weights would need the same N: gate and up of 48 */
          void *wu = kt_rand_tensor(wdts[d], (size_t)N[0] * K, 0.5f);
          float *g = malloc(sizeof(float) * (size_t)T * ld),
                *u = malloc(sizeof(float) * (size_t)T * N[0]);
          float *scratch = malloc(sizeof(float) * (size_t)T * N[0]);
          TH_REQUIRE(g && u && scratch);
          memset(g, 0, sizeof(float) * (size_t)T * ld);
          TH_REQUIRE(kn_matmul_glu(be[b], g, ld, in, K, w[0], NULL, wu, NULL, wdts[d], T, N[0], K,
                                   scratch) == 0);
          TH_REQUIRE(kn_matmul(be[b], u, N[0], in, K, wu, wdts[d], T, N[0], K, 0) == 0);
          TH_REQUIRE(kn_gelu_mul(be[b], want[0], ld, want[0], ld, u, N[0], T, N[0]) == 0);
          for (int t = 0; t < T; t++)
            if (!kt_bits_equal(g + (size_t)t * ld, want[0] + (size_t)t * ld, (size_t)N[0]))
              th_fail(__FILE__, __LINE__, "%s matmul_glu row %d T=%d K=%d %s differs",
                      kn_backend_name(be[b]), t, T, K, kn_dtype_name(wdts[d]));
          free(in), free(wu), free(g), free(u), free(scratch);
          for (int i = 0; i < 3; i++)
            free(w[i]), free(got[i]), free(want[i]);
        }
  for (int b = 0; b < n; b++)
    kn_backend_destroy(be[b]);
}

/* ---- block-format weights in the q8 mode ------------------------------------ */

/* A random [N, K] weight in block format dt (kn_quantize_row's rows). */
static void *block_weight(enum kn_dtype dt, int N, int K) {
  float *wf = kt_rand_f32((size_t)N * K, 0.5f);
  size_t rb = kn_row_bytes(dt, (size_t)K);
  unsigned char *w = malloc(rb * (size_t)N);
  TH_REQUIRE(w);
  for (int r = 0; r < N; r++)
    TH_REQUIRE(kn_quantize_row(dt, wf + (size_t)r * K, w + rb * (size_t)r, (size_t)K) == 0);
  free(wf);
  return w;
}

/* In the q8 mode (inputs prepared once for all parts, one task) kn_matmul_n
 * and kn_matmul_glu over every block format give the bits of their kn_matmul
 * calls and kn_gelu_mul on every table: one token (decode) and several (the
 * tiles), N not a multiple of the 4-row tiles, an odd number of blocks
 * (Q4_0's pairs), a strided output, an empty part. Last, the weights laid out
 * 16 rows side by side (kn_weights_prepare) on the best table with the
 * AMX-INT8 tiles emulated: 17 tokens take the tiles, the rows past the groups
 * the vector kernels. */
TH_TEST(q8_matmul_n_and_glu_are_their_matmuls) {
  static const enum kn_dtype bdts[] = {KN_DTYPE_Q8_0, KN_DTYPE_Q4_0, KN_DTYPE_Q4_1, KN_DTYPE_Q5_0,
                                       KN_DTYPE_Q5_1, KN_DTYPE_Q4_K, KN_DTYPE_Q5_K, KN_DTYPE_Q6_K};
  static const int Ts[] = {1, 5, 17};
  kt_seed(35);
  for (int isa = KN_CPU_ISA_REF; isa <= (int)kn_cpu_isa_detect() + 1; isa++) {
    struct kn_backend *be = NULL;
    const int tiles = isa > (int)kn_cpu_isa_detect();
    if (tiles)
      TH_REQUIRE(kn_cpu_backend_create_q8_amx_emulated(2, &be) == 0 && be);
    else
      TH_REQUIRE(kn_cpu_backend_create_mode(2, (enum kn_cpu_isa)isa, 2, &be) == 0 && be);
    for (size_t d = 0; d < CM_ARRAY_LEN(bdts); d++)
      for (size_t ti = 0; ti < CM_ARRAY_LEN(Ts); ti++) {
        enum kn_dtype dt = bdts[d];
        const int T = Ts[ti], K = kn_block_elems(dt) == 256 ? 512 : 96, ld = 80;
        const int N[4] = {70, 17, 0, 33};
        float *in = kt_rand_f32((size_t)T * K, 1.0f);
        void *w[4];
        float *got[4], *want[4];
        struct kn_mm_part parts[4];
        for (int i = 0; i < 4; i++)
          w[i] = block_weight(bdts[d], N[i] > 0 ? N[i] : 1, K);
        for (int i = 0; i < 4 && tiles; i++) { /* every part with its N rows side by side */
          enum kn_dtype x = bdts[d];
          if (N[i] > 0) TH_REQUIRE(kn_weights_prepare(be, w[i], &x, N[i], K) == 0);
          if (N[i] > 0) dt = x;
        }
        for (int i = 0; i < 4; i++) {
          const int ldo = i == 1 ? ld : N[i] > 0 ? N[i] : 1;
          got[i] = kt_rand_f32((size_t)T * ldo, 1.0f);
          want[i] = dup_f32(got[i], (size_t)T * ldo);
          parts[i] = (struct kn_mm_part){got[i], ldo, w[i], N[i]};
          if (N[i] > 0)
            TH_REQUIRE(kn_matmul(be, want[i], ldo, in, K, w[i], dt, T, N[i], K, 0) == 0);
        }
        TH_REQUIRE(kn_matmul_n(be, in, K, dt, T, K, parts, 4) == 0);
        for (int i = 0; i < 4; i++)
          if (!kt_rows_equal(got[i], parts[i].ldo, want[i], parts[i].ldo, T,
                             N[i] > 0 ? N[i] : parts[i].ldo))
            th_fail(__FILE__, __LINE__, "%s q8 matmul_n part %d T=%d %s differs",
                    kn_backend_name(be), i, T, kn_dtype_name(dt));
        /* gate and up of 33 rows (the gate the first of 70, or with rows side
         * by side, which go only whole, the 33 of the up), into a strided output */
        float *g = kt_rand_f32((size_t)T * ld, 1.0f), *u = malloc(sizeof(float) * (size_t)T * 70);
        float *scratch = malloc(sizeof(float) * (size_t)T * 70);
        TH_REQUIRE(u && scratch);
        float *g2 = dup_f32(g, (size_t)T * ld);
        const void *wg = tiles ? w[3] : w[0];
        TH_REQUIRE(kn_matmul_glu(be, g, ld, in, K, wg, NULL, w[3], NULL, dt, T, 33, K, scratch) ==
                   0);
        TH_REQUIRE(kn_matmul(be, g2, ld, in, K, wg, dt, T, 33, K, 0) == 0);
        TH_REQUIRE(kn_matmul(be, u, 33, in, K, w[3], dt, T, 33, K, 0) == 0);
        TH_REQUIRE(kn_gelu_mul(be, g2, ld, g2, ld, u, 33, T, 33) == 0);
        if (!kt_rows_equal(g, ld, g2, ld, T, ld))
          th_fail(__FILE__, __LINE__, "%s q8 matmul_glu T=%d %s differs", kn_backend_name(be), T,
                  kn_dtype_name(dt));
        free(in), free(g), free(g2), free(u), free(scratch);
        for (int i = 0; i < 4; i++)
          free(w[i]), free(got[i]), free(want[i]);
      }
    kn_backend_destroy(be);
  }
}

/* ---- FP8 weights ------------------------------------------------------------ */

/* Every CPU kernel table this processor has (under LMSERVE_KERNELS), each in
 * the default and the bf16 mode; returns how many (callers destroy them). */
static int all_tables(struct kn_backend *be[2 * (KN_CPU_ISA_BEST + 1)]) {
  int n = 0;
  for (int isa = KN_CPU_ISA_REF; isa <= (int)kn_cpu_isa_detect(); isa++)
    for (int bf16 = 0; bf16 < 2; bf16++) {
      be[n] = NULL;
      TH_REQUIRE(kn_cpu_backend_create_mode(2, (enum kn_cpu_isa)isa, bf16, &be[n]) == 0 && be[n]);
      n++;
    }
  return n;
}

/* A random [N, K] weight quantized per output feature as --quantization fp8
 * does: the codes (returned) and *scale, both malloc'd. */
static uint8_t *fp8_weight(int N, int K, float **scale) {
  float *wf = kt_rand_f32((size_t)N * K, 0.05f);
  uint8_t *q = malloc((size_t)N * K);
  *scale = malloc(sizeof(float) * (size_t)N);
  TH_REQUIRE(q && *scale);
  TH_REQUIRE(kn_fp8_quantize_rows(q, *scale, wf, KN_DTYPE_F32, K, N, K, NULL) == 0);
  free(wf);
  return q;
}

/* kn_matmul_n and kn_matmul_glu over FP8 weights give the bits of their
 * kn_matmul_fp8 calls (and kn_gelu_mul) on every table: T past the device's
 * few-rows limits (33) and its FP8 tensor-core threshold (70), N not a
 * multiple of 8 or 16, K an odd multiple of 16 or of 8 only, strided rows. */
TH_TEST(fp8_matmul_n_and_glu_are_their_fp8_matmuls) {
  struct kn_backend *be[2 * (KN_CPU_ISA_BEST + 1)];
  int nb = all_tables(be);
  kt_seed(35);
  static const int Ts[] = {1, 3, 33, 70}, Ks[] = {48, 208, 40};
  const int N[3] = {44, 13, 13}, ld = 64; /* part 0 and the GLU's output strided */
  for (size_t ki = 0; ki < CM_ARRAY_LEN(Ks); ki++) {
    int K = Ks[ki];
    uint8_t *w[3], *wg, *wu;
    float *sc[3], *sg, *su;
    for (int i = 0; i < 3; i++)
      w[i] = fp8_weight(N[i], K, &sc[i]);
    wg = fp8_weight(N[0], K, &sg);
    wu = fp8_weight(N[0], K, &su);
    for (size_t ti = 0; ti < CM_ARRAY_LEN(Ts); ti++) {
      int T = Ts[ti];
      ptrdiff_t ldi = T == 70 ? K + 5 : K; /* a rank's slice of a wider input */
      float *in = kt_rand_f32((size_t)T * ldi, 2.0f);
      for (int b = 0; b < nb; b++) {
        float *got[3], *want[3];
        struct kn_mm_part parts[3];
        for (int i = 0; i < 3; i++) {
          int ldo = i == 0 ? ld : N[i];
          got[i] = kt_rand_f32((size_t)T * ldo, 1.0f);
          want[i] = dup_f32(got[i], (size_t)T * ldo);
          parts[i] = (struct kn_mm_part){got[i], ldo, w[i], N[i], sc[i]};
          TH_REQUIRE(kn_matmul_fp8(be[b], want[i], ldo, in, ldi, w[i], sc[i], T, N[i], K, 0) == 0);
        }
        TH_REQUIRE(kn_matmul_n(be[b], in, ldi, KN_DTYPE_F8E4M3, T, K, parts, 3) == 0);
        for (int i = 0; i < 3; i++)
          if (!kt_bits_equal(got[i], want[i], (size_t)T * (i == 0 ? ld : N[i])))
            th_fail(__FILE__, __LINE__, "%s fp8 matmul_n part %d T=%d K=%d differs",
                    kn_backend_name(be[b]), i, T, K);
        float *g = kt_rand_f32((size_t)T * ld, 1.0f), *g2 = dup_f32(g, (size_t)T * ld);
        float *u = malloc(sizeof(float) * (size_t)T * N[0]);
        float *scratch = malloc(sizeof(float) * (size_t)T * N[0]);
        TH_REQUIRE(u && scratch);
        TH_REQUIRE(kn_matmul_glu(be[b], g, ld, in, ldi, wg, sg, wu, su, KN_DTYPE_F8E4M3, T, N[0], K,
                                 scratch) == 0);
        TH_REQUIRE(kn_matmul_fp8(be[b], g2, ld, in, ldi, wg, sg, T, N[0], K, 0) == 0);
        TH_REQUIRE(kn_matmul_fp8(be[b], u, N[0], in, ldi, wu, su, T, N[0], K, 0) == 0);
        TH_REQUIRE(kn_gelu_mul(be[b], g2, ld, g2, ld, u, N[0], T, N[0]) == 0);
        if (!kt_bits_equal(g, g2, (size_t)T * ld))
          th_fail(__FILE__, __LINE__, "%s fp8 matmul_glu T=%d K=%d differs", kn_backend_name(be[b]),
                  T, K);
        free(g), free(g2), free(u), free(scratch);
        for (int i = 0; i < 3; i++)
          free(got[i]), free(want[i]);
      }
      free(in);
    }
    for (int i = 0; i < 3; i++)
      free(w[i]), free(sc[i]);
    free(wg), free(wu), free(sg), free(su);
  }
  for (int b = 0; b < nb; b++)
    kn_backend_destroy(be[b]);
}

/* ---- bad input, declining ops, the check ------------------------------------- */

TH_TEST(fused_bad_arguments_are_errors) {
  struct kn_backend *be = kt_backend(KN_CPU_ISA_REF, 1);
  float x[64] = {0}, o[64] = {0}, h[64] = {0}, w[32] = {0};
  TH_CHECK_EQ_INT(kn_add_norm(be, x, 32, o, 32, h, 32, 2, 32, w, NULL, KN_DTYPE_F32, 1.0f, 1e-6f,
                              KN_NORM_MUL_W),
                  CM_ERR_INVAL); /* h without its weight */
  TH_CHECK_EQ_INT(kn_add_norm(be, x, 16, o, 32, NULL, 0, 2, 32, w, NULL, KN_DTYPE_F32, 1.0f, 1e-6f,
                              KN_NORM_MUL_W),
                  CM_ERR_INVAL); /* stride below the row */
  TH_CHECK_EQ_INT(kn_add_norm(be, x, 32, o, 32, NULL, 0, 2, 32, w, NULL, KN_DTYPE__COUNT, 1.0f,
                              1e-6f, KN_NORM_MUL_W),
                  CM_ERR_UNSUPPORTED);
  TH_CHECK_EQ_INT(kn_add_norm(be, x, 32, o, 32, NULL, 0, 2, 32, w, NULL, KN_DTYPE_F32, NAN, 1e-6f,
                              KN_NORM_MUL_W),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_add_norm(be, x, 32, o, 32, NULL, 0, 0, 32, NULL, NULL, KN_DTYPE_F32, 1.0f,
                              1e-6f, (enum kn_norm_mode)7),
                  0);                /* nothing to do */
  static float pool[4 * 2 * 16 * 8]; /* 4 pages of K and V for 16 tokens of one head of 8 */
  float freq[4] = {1, 1, 1, 1};
  struct kn_kv_view view = {.pool = pool,
                            .page_bytes = sizeof(float) * 2 * 16 * 8,
                            .n_pages = 4,
                            .k_off = 0,
                            .v_off = sizeof(float) * 16 * 8,
                            .block_tokens = 16,
                            .n_kv_heads = 1,
                            .head_dim = 8,
                            .dtype = KN_DTYPE_F32};
  int32_t pos[2] = {0, 1}, slots[2] = {0, 64}; /* 64: past the pool's 64 slots */
  struct kn_qkv_prep_args pr = {.q = x,
                                .ldq = 16,
                                .n_heads = 2,
                                .k = o,
                                .v = h,
                                .ldk = 8,
                                .ldv = 8,
                                .q_w = w,
                                .k_w = w,
                                .wdt = KN_DTYPE_F32,
                                .eps = 1e-6f,
                                .mode = KN_NORM_MUL_W,
                                .pos = pos,
                                .inv_freq = freq,
                                .view = &view,
                                .slots = slots};
  TH_CHECK_EQ_INT(kn_qkv_prep(be, &pr, 2), CM_ERR_RANGE);
  slots[1] = 1;
  pos[1] = -1;
  TH_CHECK_EQ_INT(kn_qkv_prep(be, &pr, 2), CM_ERR_RANGE);
  pos[1] = 1;
  pr.v = NULL; /* k without v */
  TH_CHECK_EQ_INT(kn_qkv_prep(be, &pr, 2), CM_ERR_INVAL);
  pr.v = h;
  TH_CHECK_EQ_INT(kn_qkv_prep(be, &pr, 2), 0);
  struct kn_mm_part parts[5] = {{o, 8, w, 8}};
  TH_CHECK_EQ_INT(kn_matmul_n(be, x, 4, KN_DTYPE_F32, 2, 4, parts, 0), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_n(be, x, 4, KN_DTYPE_F32, 2, 4, parts, 5), CM_ERR_INVAL);
  parts[0].ldo = 4; /* below N */
  TH_CHECK_EQ_INT(kn_matmul_n(be, x, 4, KN_DTYPE_F32, 2, 4, parts, 1), CM_ERR_INVAL);
  /* a backend running the sequence needs the scratch */
  TH_CHECK_EQ_INT(kn_matmul_glu(be, o, 8, x, 4, w, NULL, w, NULL, KN_DTYPE_F32, 2, 8, 4, NULL),
                  CM_ERR_INVAL);
  /* FP8 weights need their scales, other weights take none */
  float sc[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  uint8_t q[32] = {0};
  struct kn_mm_part fp[2] = {{o, 8, q, 8, sc}, {h, 8, q, 8, NULL}};
  TH_CHECK_EQ_INT(kn_matmul_n(be, x, 4, KN_DTYPE_F8E4M3, 2, 4, fp, 2), CM_ERR_INVAL); /* missing */
  fp[1].scale = sc;
  TH_CHECK_EQ_INT(kn_matmul_n(be, x, 4, KN_DTYPE_F8E4M3, 2, 4, fp, 2), 0);
  struct kn_mm_part bp[2] = {{o, 8, w, 8, NULL}, {h, 8, w, 8, sc}};
  TH_CHECK_EQ_INT(kn_matmul_n(be, x, 4, KN_DTYPE_F32, 2, 4, bp, 2), CM_ERR_INVAL); /* stray */
  bp[1].scale = NULL;
  TH_CHECK_EQ_INT(kn_matmul_n(be, x, 4, KN_DTYPE_F32, 2, 4, bp, 2), 0);
  TH_CHECK_EQ_INT(kn_matmul_glu(be, o, 8, x, 4, q, sc, q, NULL, KN_DTYPE_F8E4M3, 2, 8, 4, h),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_glu(be, o, 8, x, 4, q, NULL, q, sc, KN_DTYPE_F8E4M3, 2, 8, 4, h),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_glu(be, o, 8, x, 4, q, sc, q, sc, KN_DTYPE_F8E4M3, 2, 8, 4, h), 0);
  TH_CHECK_EQ_INT(kn_matmul_glu(be, o, 8, x, 4, w, sc, w, NULL, KN_DTYPE_F32, 2, 8, 4, h),
                  CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_glu(be, o, 8, x, 4, w, NULL, w, sc, KN_DTYPE_BF16, 2, 8, 4, h),
                  CM_ERR_INVAL);
  kn_backend_destroy(be);
}

static int decline_add_norm(void *ctx, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo, float *h,
                            ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                            enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode) {
  (void)ctx, (void)x, (void)ldx, (void)o, (void)ldo, (void)h, (void)ldh, (void)T, (void)H;
  (void)post_w, (void)next_w, (void)wdt, (void)scale, (void)eps, (void)mode;
  return CM_ERR_UNSUPPORTED;
}

/* The CPU's add_norm, then one element of x off by one ulp: what a broken kernel does. */
static const struct kn_backend_ops *g_cpu_ops;
static int wrong_add_norm(void *ctx, float *x, ptrdiff_t ldx, float *o, ptrdiff_t ldo, float *h,
                          ptrdiff_t ldh, int T, int H, const void *post_w, const void *next_w,
                          enum kn_dtype wdt, float scale, float eps, enum kn_norm_mode mode) {
  int rc =
      g_cpu_ops->add_norm(ctx, x, ldx, o, ldo, h, ldh, T, H, post_w, next_w, wdt, scale, eps, mode);
  x[(T - 1) * ldx + H / 2] = nextafterf(x[(T - 1) * ldx + H / 2], INFINITY);
  return rc;
}

/* The sequences as fused ops of the alias backend g_alias, but one output
 * one ulp off for FP8 weights: the check must find the FP8 variants wrong
 * and them only. */
static struct kn_backend *g_alias;
static int fp8_wrong_matmul_n(void *ctx, const float *in, ptrdiff_t ldi, enum kn_dtype wdt, int T,
                              int K, const struct kn_mm_part *parts, int n_parts) {
  (void)ctx;
  int rc = kn__seq_matmul_n(g_alias, in, ldi, wdt, T, K, parts, n_parts);
  if (!rc && wdt == KN_DTYPE_F8E4M3) {
    float *o = parts[0].out + (T - 1) * parts[0].ldo + parts[0].N - 1;
    *o = nextafterf(*o, INFINITY);
  }
  return rc;
}

static int fp8_wrong_matmul_glu(void *ctx, float *out, ptrdiff_t ldo, const float *in,
                                ptrdiff_t ldi, const void *wg, const float *sg, const void *wu,
                                const float *su, enum kn_dtype wdt, int T, int N, int K) {
  (void)ctx;
  float *scratch = malloc(sizeof(float) * (size_t)T * (size_t)N);
  if (!scratch) return CM_ERR_NOMEM;
  int rc = kn__seq_matmul_glu(g_alias, out, ldo, in, ldi, wg, sg, wu, su, wdt, T, N, K, scratch);
  free(scratch);
  if (!rc && wdt == KN_DTYPE_F8E4M3) out[0] = nextafterf(out[0], INFINITY);
  return rc;
}

TH_TEST(fused_check_passes_the_cpu_and_catches_a_wrong_kernel) {
  struct kn_backend *be[3];
  int n = backends(be);
  char why[256];
  for (int b = 0; b < n; b++) {
    TH_CHECK_EQ_INT(kn_fused_check(be[b], 0.0, why, sizeof why), 0);
    if (why[0]) fprintf(stderr, "%s\n", why);
  }
  /* the same context behind a table whose add_norm declines, then one that is wrong */
  g_cpu_ops = be[1]->ops;
  struct kn_backend_ops ops = *be[1]->ops;
  struct kn_backend alias = {.ops = &ops, .caps = be[1]->caps, .ctx = be[1]->ctx};
  ops.add_norm = decline_add_norm;
  kt_seed(34);
  check_add_norm(&alias, 5, 100, 100, KN_DTYPE_BF16, KN_NORM_MUL_W, 0.5f, 1); /* the sequence ran */
  TH_CHECK_EQ_INT(kn_fused_check(&alias, 0.0, why, sizeof why), 0);
  ops.add_norm = wrong_add_norm;
  TH_CHECK_EQ_INT(kn_fused_check(&alias, 0.0, why, sizeof why), KN_FUSED_ADD_NORM);
  TH_CHECK(strstr(why, "add_norm") != NULL);
  TH_CHECK_EQ_INT(kn_fused_check(&alias, 1e-3, why, sizeof why), 0); /* one ulp is within 1e-3 */
  /* fused matmuls that are the sequence but for FP8 weights */
  ops.add_norm = g_cpu_ops->add_norm;
  ops.matmul_n = fp8_wrong_matmul_n;
  g_alias = &alias;
  TH_CHECK_EQ_INT(kn_fused_check(&alias, 0.0, why, sizeof why), KN_FUSED_MATMUL_N_FP8);
  TH_CHECK(strstr(why, "matmul_n fp8") != NULL);
  ops.matmul_glu = fp8_wrong_matmul_glu;
  TH_CHECK_EQ_INT(kn_fused_check(&alias, 0.0, why, sizeof why),
                  KN_FUSED_MATMUL_N_FP8 | KN_FUSED_MATMUL_GLU_FP8);
  ops.matmul_n = NULL;
  TH_CHECK_EQ_INT(kn_fused_check(&alias, 0.0, why, sizeof why), KN_FUSED_MATMUL_GLU_FP8);
  TH_CHECK(strstr(why, "matmul_glu fp8") != NULL);
  for (int b = 0; b < n; b++)
    kn_backend_destroy(be[b]);
}

/* The CPU backend has no step graphs: it says so, and the wrappers check their
 * arguments before asking. */
TH_TEST(cpu_backend_has_no_step_graphs) {
  struct kn_backend *be[3];
  int n = backends(be);
  struct kn_graph *g = (struct kn_graph *)&n;
  for (int b = 0; b < n; b++) {
    TH_CHECK_EQ_INT(kn_graph_new(be[b], 1024, &g), CM_ERR_UNSUPPORTED);
    TH_CHECK(g == NULL);
    TH_CHECK_EQ_INT(kn_graph_new(be[b], 0, &g), CM_ERR_INVAL);
    TH_CHECK_EQ_INT(kn_graph_begin(be[b], NULL, KN_GRAPH_MEASURE), CM_ERR_INVAL);
    TH_CHECK_EQ_INT(kn_graph_end(be[b], NULL, 1), CM_ERR_INVAL);
    kn_graph_free(be[b], NULL);
  }
  for (int b = 0; b < n; b++)
    kn_backend_destroy(be[b]);
}
