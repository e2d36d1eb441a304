/* test-wk-fp8.c — FP8 weights on the CPU's reference kernels: kn_matmul_fp8
 * and the per-channel quantizer against direct computations; a compressed-
 * tensors FP8 checkpoint written by tests/reference/fp8_ref.py (numpy, from
 * the format's definition) against the same checkpoint dequantized by numpy;
 * --quantization fp8 giving numpy's codes; the refusals: a CPU, a checkpoint
 * quantized twice, bad scales, unsupported schemes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "common/cm-proc.h"
#include "kernels/cpu/kn-cpu.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"

/* ---- the op ------------------------------------------------------------------ */

static float rnd(uint32_t *r) {
  *r = *r * 1664525u + 1013904223u;
  return (float)(*r >> 8) / (float)(1u << 23) - 1.0f;
}

/* out[t, n] = acc0 + scale[n] * sum_k bf16(in[t, k]) * e4m3(w[n, k]) in double */
static void matmul_fp8_ref(double *out, const float *in, int ldi, const uint8_t *w,
                           const float *scale, int T, int N, int K, const float *acc0, int ldo) {
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++)
        s += (double)kn_bf16_to_f32(kn_f32_to_bf16(in[t * ldi + k])) *
             (double)kn_f8e4m3_to_f32(w[(size_t)n * K + k]);
      out[t * N + n] = (acc0 ? acc0[t * ldo + n] : 0.0) + (double)scale[n] * s;
    }
}

TH_TEST(matmul_fp8_on_every_table_matches_the_sum) {
  static const struct {
    int T, N, K;
  } shapes[] = {{1, 37, 1160}, {3, 5, 24}, {37, 67, 301}, {70, 9, 64}};
  for (size_t si = 0; si < CM_ARRAY_LEN(shapes); si++) {
    int T = shapes[si].T, N = shapes[si].N, K = shapes[si].K, ldi = K + 3, ldo = N + 2;
    uint32_t r = 17u + (uint32_t)si;
    float *in = malloc(sizeof(float) * (size_t)T * ldi), *wf = malloc(sizeof(float) * N * K);
    uint8_t *w = malloc((size_t)N * K);
    float *scale = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * (size_t)T * ldo);
    float *first = malloc(sizeof(float) * (size_t)T * ldo);
    double *want = malloc(sizeof(double) * (size_t)T * N);
    TH_REQUIRE(in && wf && w && scale && out && first && want);
    for (int i = 0; i < T * ldi; i++)
      in[i] = 4.0f * rnd(&r);
    for (int i = 0; i < N * K; i++)
      wf[i] = 0.05f * rnd(&r) * (i % 7 == 0 ? 40.0f : 1.0f);
    TH_REQUIRE(kn_fp8_quantize_rows(w, scale, wf, KN_DTYPE_F32, K, N, K, NULL) == 0);
    for (int acc = 0; acc < 2; acc++) {
      matmul_fp8_ref(want, in, ldi, w, scale, T, N, K, NULL, 0);
      for (int isa = KN_CPU_ISA_REF; isa <= KN_CPU_ISA_AVX512; isa++) {
        struct kn_backend *be = NULL;
        TH_REQUIRE(kn_cpu_backend_create_isa(2, (enum kn_cpu_isa)isa, &be) == 0);
        for (int i = 0; i < T * ldo; i++)
          out[i] = acc ? 0.5f : NAN;
        TH_REQUIRE(kn_matmul_fp8(be, out, ldo, in, ldi, w, scale, T, N, K, acc) == 0);
        double big = 1e-30, worst = 0;
        for (int t = 0; t < T; t++)
          for (int n = 0; n < N; n++) {
            double e = want[t * N + n] + (acc ? 0.5 : 0.0);
            big = fmax(big, fabs(e));
            worst = fmax(worst, fabs(out[t * ldo + n] - e));
            if (isnan(out[t * ldo + n])) worst = INFINITY;
          }
        TH_CHECK(worst <= 1e-5 * big);
        /* the vector tables give the same bits (the reference sums in its own order) */
        if (isa == KN_CPU_ISA_AVX2)
          memcpy(first, out, sizeof(float) * (size_t)T * ldo);
        else if (isa > KN_CPU_ISA_AVX2)
          TH_CHECK(memcmp(first, out, sizeof(float) * (size_t)T * ldo) == 0);
        kn_backend_destroy(be);
      }
    }
    free(in);
    free(wf);
    free(w);
    free(scale);
    free(out);
    free(first);
    free(want);
  }
}

TH_TEST(matmul_fp8_checks_its_arguments) {
  struct kn_backend *be = wkt_cpu_backend(1);
  float in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[4] = {7, 7, 7, 7}, scale[2] = {1, 2};
  uint8_t w[8] = {0x38, 0x38, 0x38, 0x38, 0x40, 0x40, 0x40, 0x40}; /* 1.0 and 2.0 */
  TH_CHECK_EQ_INT(kn_matmul_fp8(be, out, 2, in, 4, w, NULL, 2, 2, 4, 0), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_fp8(be, out, 1, in, 4, w, scale, 2, 2, 4, 0), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_fp8(be, out, 2, in, 4, w, scale, -1, 2, 4, 0), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(kn_matmul_fp8(be, out, 2, in, 4, w, scale, 2, 2, 4, 0), 0);
  TH_CHECK(out[0] == 10.0f && out[1] == 40.0f && out[2] == 26.0f && out[3] == 104.0f);
  TH_CHECK_EQ_INT(kn_matmul_fp8(be, out, 2, in, 4, w, scale, 2, 2, 0, 0), 0); /* K = 0 */
  TH_CHECK(out[0] == 0.0f && out[3] == 0.0f);
  char why[256] = "";
  TH_CHECK_EQ_INT(kn_fp8_weights(be, why, sizeof(why)), CM_ERR_UNSUPPORTED);
  TH_CHECK(strstr(why, "cpu") && strstr(why, "8.9"));
  kn_backend_destroy(be);
}

TH_TEST(quantize_rows_scales_saturates_and_refuses_non_finite) {
  float w[3][4] = {{0, 0, 0, 0}, {448.0f * 3, -3, 1.5f, 0.001f}, {1, NAN, 2, 3}};
  uint8_t q[12];
  float s[3];
  TH_CHECK_EQ_INT(kn_fp8_quantize_rows(q, s, w, KN_DTYPE_F32, 4, 2, 4, NULL), 0);
  TH_CHECK(s[0] == 1.0f && q[0] == 0 && q[3] == 0);       /* an all-zero row */
  TH_CHECK(s[1] == 3.0f && q[4] == 0x7e && q[5] == 0xb8); /* 448, -1.0 */
  TH_CHECK(kn_f8e4m3_to_f32(q[6]) == 0.5f);
  /* a column slice quantized with its whole row's largest magnitude */
  float amax[1] = {448.0f * 6};
  TH_CHECK_EQ_INT(kn_fp8_quantize_rows(q, s, &w[1][0], KN_DTYPE_F32, 4, 1, 2, amax), 0);
  TH_CHECK(s[0] == 6.0f && q[0] == 0x76 && kn_f8e4m3_to_f32(q[1]) == -0.5f); /* 224 */
  TH_CHECK_EQ_INT(kn_fp8_quantize_rows(q, s, w, KN_DTYPE_F32, 4, 3, 4, NULL), CM_ERR_RANGE);
  float inf[1] = {INFINITY};
  TH_CHECK_EQ_INT(kn_fp8_quantize_rows(q, s, w, KN_DTYPE_F32, 4, 1, 4, inf), CM_ERR_RANGE);
}

/* ---- models -------------------------------------------------------------------- */

#define NP 40

struct run {
  float *logits; /* [NP, V] */
  int V;
};

/* Every position's logits of one prompt through dir's model on be: a chunk of
 * 13, then 11, then one token at a time (T > 1 and T = 1 steps). 0, or a
 * cm_err with the loader's sentence in err. */
static int run_model(const char *dir, struct kn_backend *be, const struct wk_model_opts *opts,
                     struct run *out, char *err, size_t errlen) {
  struct wk_model_opts o = *opts;
  o.max_batch_tokens = 64;
  o.max_seqs = 2;
  o.kv_tokens = 256;
  o.quiet = 1;
  if (!o.kv_dtype) o.kv_dtype = 1 + KN_DTYPE_F32;
  struct wk_model *m = NULL;
  int rc = wk_model_load(dir, be, &o, &m, err, errlen);
  if (rc) return rc;
  int V = wk_model_config(m)->vocab;
  out->V = V;
  out->logits = malloc(sizeof(float) * (size_t)NP * V);
  float *step = malloc(sizeof(float) * (size_t)32 * V);
  struct wk_page_alloc pa;
  struct wk_seq_blocks blk = {0};
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  TH_REQUIRE(out->logits && step && wk_page_alloc_init(&pa, wk_model_n_pages(m)) == 0);
  int32_t prompt[NP];
  uint32_t seed = 5;
  for (int i = 0; i < NP; i++) {
    seed = seed * 1664525u + 1013904223u;
    prompt[i] = (int32_t)((seed >> 8) % (uint32_t)V);
  }
  prompt[0] = 2;
  for (int done = 0; done < NP && !rc;) {
    int n = done == 0 ? 13 : done == 13 ? 11 : 1;
    TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, done + n) == 0);
    struct wk_seq_input in = {.tokens = prompt + done, .n_tokens = n, .pos0 = done, .n_out = n};
    wkt_seq_pages(&in, kv, &blk);
    struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = step};
    rc = wk_model_forward(m, &b, err, errlen);
    memcpy(out->logits + (size_t)done * V, step, sizeof(float) * (size_t)n * V);
    done += n;
  }
  wk_seq_blocks_release(&blk, kv, &pa);
  wk_page_alloc_free(&pa);
  free(step);
  wk_model_free(m);
  return rc;
}

/* Largest |a - b| over the range of b. */
static double rel_diff(const struct run *a, const struct run *b) {
  double lo = INFINITY, hi = -INFINITY, worst = 0;
  for (size_t i = 0; i < (size_t)NP * b->V; i++) {
    lo = fmin(lo, b->logits[i]);
    hi = fmax(hi, b->logits[i]);
    double e = fabs((double)a->logits[i] - b->logits[i]);
    worst = isnan(e) ? INFINITY : fmax(worst, e);
  }
  return worst / (hi - lo);
}

struct dirs {
  char src[256], fp8[300], deq[300];
};

static void rm_dirs(struct dirs *d) {
  wkt_rmdir(d->fp8);
  wkt_rmdir(d->deq);
  wkt_rmdir(d->src);
}

/* A tiny checkpoint of arch in bf16, and fp8_ref.py's FP8 and dequantized copies
 * of it (strategy: channel, tensor, or a broken variant) beside it. */
static void make_dirs(struct dirs *d, const char *python, const char *arch, const char *strategy) {
  TH_REQUIRE(wkt_make_model(d->src, sizeof(d->src), arch, 0, 0, MD_ST_BF16, 11) == 0);
  snprintf(d->fp8, sizeof(d->fp8), "%s-fp8", d->src);
  snprintf(d->deq, sizeof(d->deq), "%s-deq", d->src);
  char script[4200], log[4096];
  snprintf(script, sizeof(script), "%s/reference/fp8_ref.py", th_tests_dir());
  char *argv[] = {(char *)python, script, d->src, d->fp8, d->deq, (char *)strategy, NULL};
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc != 0) {
    th_fail(__FILE__, __LINE__, "fp8_ref.py exited with %d:\n%s", rc, log);
    th_stop();
  }
}

/* The CPU backend in its bf16 mode: every matmul rounds its inputs to bf16, as
 * kn_matmul_fp8 does, so the dequantized checkpoint differs from the FP8 one
 * only where the scale is applied. */
static struct kn_backend *bf16_backend(void) {
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create_mode(2, KN_CPU_ISA_BEST, 1, &be) == 0);
  return be;
}

static void load_or_fail(const char *dir, struct kn_backend *be, const struct wk_model_opts *o,
                         struct run *r) {
  char err[512] = "";
  if (run_model(dir, be, o, r, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: %s", dir, err);
    th_stop();
  }
}

/* Random-weight models amplify differences layer by layer (a bf16 KV cache
 * alone moves the tiny Gemma 4's logits by a fifth of their range), so the
 * comparisons that can be exact are made exact:
 *   - power-of-two scales: code value * scale is exact in f32 and so is the
 *     scale's product, so the FP8 checkpoint and numpy's dequantized one give
 *     the same bits (both sum the same products in the same order);
 *   - --quantization fp8 on the bf16 checkpoint finds numpy's codes and
 *     scales: the same bits as numpy's FP8 checkpoint.
 * Other scales round code * scale where the FP8 path rounds the sum * scale:
 * within 1e-7 per output, amplified by the random layers, bounded loosely. */
static void check_arch(const char *arch, double loose) {
  const char *python = wkt_require_numpy("FP8 weights", "fp8_ref.py");
  struct kn_backend *be = bf16_backend();
  struct wk_model_opts ref = {.fp8_reference = 1};
  struct wk_model_opts online = {.fp8_reference = 1, .quantization = WK_QUANT_FP8};
  struct dirs p2, d;
  make_dirs(&p2, python, arch, "pow2");
  struct run fp8, deq, on, plain;
  load_or_fail(p2.fp8, be, &ref, &fp8);
  load_or_fail(p2.deq, be, &ref, &deq);
  TH_CHECK(memcmp(fp8.logits, deq.logits, sizeof(float) * (size_t)NP * fp8.V) == 0);
  free(fp8.logits);
  free(deq.logits);
  rm_dirs(&p2);

  make_dirs(&d, python, arch, "channel");
  load_or_fail(d.fp8, be, &ref, &fp8);
  load_or_fail(d.deq, be, &ref, &deq);
  load_or_fail(d.src, be, &online, &on);
  load_or_fail(d.src, be, &ref, &plain);
  TH_CHECK(memcmp(fp8.logits, on.logits, sizeof(float) * (size_t)NP * fp8.V) == 0);
  double e = rel_diff(&fp8, &deq), q = rel_diff(&on, &plain);
  printf("# %s: FP8 checkpoint vs numpy-dequantized %.3g, FP8 vs bf16 weights %.3g of the "
         "logits' range\n",
         arch, e, q);
  TH_CHECK(e <= loose);
  TH_CHECK(q > 0); /* the quantization moved something */
  free(fp8.logits);
  free(deq.logits);
  free(on.logits);
  free(plain.logits);
  kn_backend_destroy(be);
  rm_dirs(&d);
}

TH_TEST(fp8_checkpoint_matches_numpy_gemma3) {
  check_arch("gemma3", 0.01);
}

TH_TEST(fp8_checkpoint_matches_numpy_gemma4) {
  check_arch("gemma4", 0.05);
}

TH_TEST(per_tensor_scales_match_numpy) {
  const char *python = wkt_require_numpy("FP8 weights", "fp8_ref.py");
  struct dirs d;
  make_dirs(&d, python, "gemma3", "tensor");
  struct kn_backend *be = bf16_backend();
  struct wk_model_opts ref = {.fp8_reference = 1};
  struct run fp8, deq;
  load_or_fail(d.fp8, be, &ref, &fp8);
  load_or_fail(d.deq, be, &ref, &deq);
  TH_CHECK(rel_diff(&fp8, &deq) <= 0.01);
  free(fp8.logits);
  free(deq.logits);
  kn_backend_destroy(be);
  rm_dirs(&d);
}

/* --quantization fp8 under tensor parallelism: each rank's cut of every linear
 * weight holds the codes and scales of the unsplit model's rows (a cut by
 * columns quantized with its whole rows' scales), so the ranks compute the
 * one-rank model's products. */
TH_TEST(tensor_parallel_cuts_hold_the_whole_models_codes) {
  char dir[256], err[512] = "";
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), "gemma3", 0, 0, MD_ST_BF16, 13) == 0);
  struct kn_backend *be = wkt_cpu_backend(1);
  struct wk_model_opts o = wkt_small_opts(WK_QUANT_FP8);
  o.fp8_reference = 1;
  struct wk_model *one = NULL, *cut = NULL;
  TH_REQUIRE(wk_model_load(dir, be, &o, &one, err, sizeof(err)) == 0);
  for (int rank = 0; rank < 2; rank++) {
    o.tp_rank = rank;
    o.tp_size = 2;
    if (wk_model_load(dir, be, &o, &cut, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "rank %d: %s", rank, err);
      break;
    }
    for (int l = 0; l < wk_model_config(one)->n_layers; l++) {
      const struct wk_w *ws[2][3] = {
          {&one->layers[l].wo, &one->layers[l].w_down, &one->layers[l].wq},
          {&cut->layers[l].wo, &cut->layers[l].w_down, &cut->layers[l].wq}};
      for (int i = 0; i < 3; i++) {
        const struct wk_w *a = ws[0][i], *b = ws[1][i];
        TH_REQUIRE(a->dt == KN_DTYPE_F8E4M3 && b->dt == KN_DTYPE_F8E4M3);
        int cols = b->shard == WK_SHARD_COLS, r0 = cols ? 0 : b->off, c0 = cols ? b->off : 0;
        int same = 1;
        for (int r = 0; r < b->rows; r++) {
          same &= a->scale[r0 + r] == b->scale[r];
          same &= !memcmp((const uint8_t *)a->p + (size_t)(r0 + r) * a->cols + c0,
                          (const uint8_t *)b->p + (size_t)r * b->cols, (size_t)b->cols);
        }
        if (!same)
          th_fail(__FILE__, __LINE__, "rank %d layer %d weight %d: other codes or scales", rank, l,
                  i);
      }
    }
    wk_model_free(cut);
    cut = NULL;
  }
  wk_model_free(one);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}

/* The load of dir fails with code and a message holding want. */
static void check_refused(const char *dir, struct kn_backend *be, const struct wk_model_opts *o,
                          int code, const char *want) {
  char err[512] = "";
  struct run r = {0};
  int rc = run_model(dir, be, o, &r, err, sizeof(err));
  free(r.logits);
  TH_CHECK_EQ_INT(rc, code);
  if (!strstr(err, want)) th_fail(__FILE__, __LINE__, "'%s' does not say '%s'", err, want);
}

TH_TEST(fp8_is_refused_where_it_cannot_serve) {
  const char *python = wkt_require_numpy("FP8 weights", "fp8_ref.py");
  struct dirs d;
  make_dirs(&d, python, "gemma3", "channel");
  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_model_opts online = {.quantization = WK_QUANT_FP8}, none = {0};
  check_refused(d.src, be, &online, CM_ERR_UNSUPPORTED, "--quantization fp8 on");
  check_refused(d.src, be, &online, CM_ERR_UNSUPPORTED, "no FP8 weight kernels");
  check_refused(d.fp8, be, &none, CM_ERR_UNSUPPORTED, "FP8 checkpoint");
  online.fp8_reference = 1;
  check_refused(d.fp8, be, &online, CM_ERR_INVAL, "already an FP8 checkpoint");
  kn_backend_destroy(be);
  rm_dirs(&d);
}

/* Rewrites dir/config.json with `from` replaced by `to` (once). */
static void patch_config(const char *dir, const char *from, const char *to) {
  char path[4200], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof(path), "%s/config.json", dir);
  TH_REQUIRE(md_read_file(path, 1 << 20, &text, &len) == 0);
  char *at = strstr(text, from);
  TH_REQUIRE(at != NULL);
  FILE *f = fopen(path, "w");
  TH_REQUIRE(f != NULL);
  fwrite(text, 1, (size_t)(at - text), f);
  fputs(to, f);
  fputs(at + strlen(from), f);
  fclose(f);
  free(text);
}

/* A config.json edit (from -> to) and what the refusal it brings must say. */
struct patch {
  const char *from, *to, *want;
};

/* dir's config with each of patches[0..n) in turn is refused with CM_ERR_UNSUPPORTED
 * saying its want; the config is put back after each. */
static void check_patches(const char *dir, struct kn_backend *be, const struct wk_model_opts *o,
                          const struct patch *patches, size_t n) {
  for (size_t i = 0; i < n; i++) {
    patch_config(dir, patches[i].from, patches[i].to);
    check_refused(dir, be, o, CM_ERR_UNSUPPORTED, patches[i].want);
    patch_config(dir, patches[i].to, patches[i].from);
  }
}

TH_TEST(unsupported_quantization_configs_are_named) {
  const char *python = wkt_require_numpy("FP8 weights", "fp8_ref.py");
  struct dirs d;
  make_dirs(&d, python, "gemma3", "channel");
  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_model_opts ref = {.fp8_reference = 1};
  static const struct patch cases[] = {
      {"\"compressed-tensors\"", "\"awq\"", "quant_method \"awq\" is not supported"},
      {"\"strategy\": \"channel\"", "\"strategy\": \"group\"", "strategy \"group\""},
      {"\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\"",
       "\"num_bits\": 4, \"type\": \"int\", \"strategy\": \"channel\"", "only 8-bit float"},
      {"\"kv_cache_scheme\": null", "\"kv_cache_scheme\": {\"num_bits\": 8}", "kv_cache_scheme"},
      {"\"format\": \"float-quantized\"", "\"format\": \"pack-quantized\"", "pack-quantized"},
  };
  check_patches(d.fp8, be, &ref, cases, CM_ARRAY_LEN(cases));
  /* block-wise scales (quant_method fp8 with weight_block_size) */
  patch_config(d.fp8, "\"quant_method\": \"compressed-tensors\"",
               "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]");
  check_refused(d.fp8, be, &ref, CM_ERR_UNSUPPORTED, "block-wise");
  kn_backend_destroy(be);
  rm_dirs(&d);
}

/* A broken checkpoint the reference script writes (its variant) and how the loader
 * refuses it. */
struct broken {
  const char *variant, *want;
  int code;
};

TH_TEST(bad_fp8_tensors_are_named) {
  const char *python = wkt_require_numpy("FP8 weights", "fp8_ref.py");
  static const struct broken cases[] = {
      {"no-scale", "has no", CM_ERR_NOENT},
      {"bad-scale", "scales must be positive", CM_ERR_RANGE},
      {"scale-shape", "per-channel or per-tensor", CM_ERR_SHAPE},
      {"f8-norm", "F8_E4M3 only for linear layers", CM_ERR_UNSUPPORTED},
  };
  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_model_opts ref = {.fp8_reference = 1};
  for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
    struct dirs d;
    make_dirs(&d, python, "gemma3", cases[i].variant);
    check_refused(d.fp8, be, &ref, cases[i].code, cases[i].want);
    rm_dirs(&d);
  }
  kn_backend_destroy(be);
}

/* ---- an fp8 KV cache's scales from the checkpoint ------------------------------ */

/* kv_scales_ref.py's checkpoints of a tiny arch model: SCALED (k_scale / v_scale of
 * 8 for `which`, a kv_cache_scheme) and MOVED (that scale moved into the weights). */
static void make_kv_dirs(struct dirs *d, const char *python, const char *arch, const char *which,
                         const char *variant) {
  TH_REQUIRE(wkt_make_model(d->src, sizeof(d->src), arch, 0, 0, MD_ST_BF16, 13) == 0);
  snprintf(d->fp8, sizeof(d->fp8), "%s-kvs", d->src);
  snprintf(d->deq, sizeof(d->deq), "%s-moved", d->src);
  char script[4200], log[4096];
  snprintf(script, sizeof(script), "%s/reference/kv_scales_ref.py", th_tests_dir());
  char *argv[] = {(char *)python, script,        d->src,          d->fp8,
                  d->deq,         (char *)which, (char *)variant, NULL};
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc != 0) {
    th_fail(__FILE__, __LINE__, "kv_scales_ref.py exited with %d:\n%s", rc, log);
    th_stop();
  }
}

/* With an fp8 cache the checkpoint's scales divide what the cache stores and multiply
 * what it reads: numpy's checkpoint with scale 8 and its copy with the 8 moved into the
 * weights instead (every product a power of two times the same one) give the same
 * logits bit for bit, on the default table and in the bf16 mode, whether the scales are
 * one per tensor, a scalar or one per kv head; without them (a bf16 cache, which leaves
 * the scales unused) the two checkpoints differ, and so do the scaled checkpoint's
 * logits with and without scales, so the comparison can fail. */
static void check_kv_scales(const char *arch, const char *which) {
  const char *python = wkt_require_numpy("an fp8 KV cache's scales", "kv_scales_ref.py");
  static const char *const variants[] = {"tensor", "scalar", "head"};
  struct wk_model_opts fp8 = {.kv_dtype = 1 + KN_DTYPE_F8E4M3};
  for (int bf16 = 0; bf16 < 2; bf16++)
    for (size_t v = 0; v < CM_ARRAY_LEN(variants); v++) {
      if (bf16 && v) continue; /* the bf16 mode once */
      struct kn_backend *be = bf16 ? bf16_backend() : wkt_cpu_backend(2);
      struct dirs d;
      make_kv_dirs(&d, python, arch, which, variants[v]);
      struct run scaled, moved;
      load_or_fail(d.fp8, be, &fp8, &scaled);
      load_or_fail(d.deq, be, &fp8, &moved);
      size_t bytes = sizeof(float) * (size_t)NP * scaled.V;
      if (memcmp(scaled.logits, moved.logits, bytes))
        th_fail(__FILE__, __LINE__, "%s %s scales (%s)%s: logits differ by %.3g of their range",
                arch, which, variants[v], bf16 ? ", bf16 mode" : "", rel_diff(&scaled, &moved));
      if (!v && !bf16) { /* the scale did something: without it the two differ */
        struct wk_model_opts plain = {.kv_dtype = 1 + KN_DTYPE_BF16};
        struct run a, b;
        load_or_fail(d.fp8, be, &plain, &a);
        load_or_fail(d.deq, be, &plain, &b);
        TH_CHECK(memcmp(a.logits, scaled.logits, bytes) != 0);
        printf("# %s: %s scale 8 vs the same model with a bf16 cache: %.3g of the range\n", arch,
               which, rel_diff(&scaled, &a));
        free(a.logits);
        free(b.logits);
      }
      free(scaled.logits);
      free(moved.logits);
      kn_backend_destroy(be);
      rm_dirs(&d);
    }
}

TH_TEST(kv_scales_gemma3_v) {
  check_kv_scales("gemma3", "v");
}

TH_TEST(kv_scales_gemma4_k) {
  check_kv_scales("gemma4", "k");
}

/* A missing, negative or misshapen scale, and schemes other than static 8-bit float
 * ones, are refused naming the tensor or the field. */
TH_TEST(bad_kv_scales_are_named) {
  const char *python = wkt_require_numpy("an fp8 KV cache's scales", "kv_scales_ref.py");
  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_model_opts fp8 = {.kv_dtype = 1 + KN_DTYPE_F8E4M3};
  static const struct broken cases[] = {
      {"missing", "k_scale missing", CM_ERR_NOENT},
      {"negative", "scales must be positive", CM_ERR_RANGE},
      {"shape", "has shape [2, 2]", CM_ERR_SHAPE},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
    struct dirs d;
    make_kv_dirs(&d, python, "gemma3", "v", cases[i].variant);
    check_refused(d.fp8, be, &fp8, cases[i].code, cases[i].want);
    rm_dirs(&d);
  }
  struct dirs d;
  make_kv_dirs(&d, python, "gemma3", "v", "tensor");
  static const struct patch schemes[] = {
      {"\"dynamic\": false", "\"dynamic\": true", "dynamic scales"},
      {"\"symmetric\": true", "\"symmetric\": false", "asymmetric"},
      {"\"strategy\": \"tensor\"", "\"strategy\": \"channel\"", "tensor or attn_head"},
      {"\"num_bits\": 8, \"type\": \"float\"", "\"num_bits\": 4, \"type\": \"int\"",
       "only 8-bit float"},
  };
  check_patches(d.fp8, be, &fp8, schemes, CM_ARRAY_LEN(schemes));
  rm_dirs(&d);
  kn_backend_destroy(be);
}
