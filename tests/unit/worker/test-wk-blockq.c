/* test-wk-blockq.c — --quantization q8_0|q4_0|q4_k (ggml's block formats at
 * load) against the GGUF file `lmserve quantize` writes from the same
 * checkpoint with the same type: the same logits, bit for bit, on one rank;
 * every tensor-parallel rank's cut of every quantized matrix the same bytes as
 * the file's cut on that rank (Q4_K's down projection cut unevenly in whole
 * blocks, 512 and 256 of its 768 columns, as the file's is); a cut that
 * cannot fall on Q4_K's blocks at load as Q5_0; the refusals (a GGUF file, a
 * file's cut with fewer blocks than ranks, a backend without block kernels, an
 * unknown name); and a file of llama.cpp's IQ4_XS cut by two ranks, and refused by a
 * backend without KN_CAP_BLOCK_LOWBIT. The checkpoint is the k256 preset with 768 MLP columns,
 * whose rows are whole 256-blocks, so Q4_K is Q4_K; the tiny preset's are not, and there q4_k falls
 * back to Q5_0 as the file does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "kernels/kn-backend-impl.h"
#include "tests/harness/th-llamacpp.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"

static const struct {
  const char *name;
  int quant;
  enum kn_dtype dt;
} types[] = {{"q8_0", WK_QUANT_Q8_0, KN_DTYPE_Q8_0},
             {"q4_0", WK_QUANT_Q4_0, KN_DTYPE_Q4_0},
             {"q4_k", WK_QUANT_Q4_K, KN_DTYPE_Q4_K}};

/* A checkpoint of preset (k256 or tiny; vocabulary 512, bf16; MLPs ffn wide, 0:
 * the preset's) in dir and, for
 * each type, the GGUF file `lmserve quantize` writes from it beside it
 * (gguf[i]). */
static void make_preset(char *dir, size_t n, char gguf[][300], const char *preset, int ffn) {
  struct tl_tiny_opts o = {.arch = "gemma3", .preset = preset, .vocab = 512, .ffn = ffn};
  wkt_make_tiny(dir, n, &o, 7, MD_ST_BF16);
  for (size_t i = 0; i < CM_ARRAY_LEN(types); i++) {
    snprintf(gguf[i], 300, "%s/m-%s.gguf", dir, types[i].name);
    wkt_lmserve("quantize", dir, gguf[i], (char *)types[i].name);
  }
}

static void make(char *dir, size_t n, char gguf[][300]) {
  make_preset(dir, n, gguf, "k256", 768);
}

#define NP 24

/* Every position's logits of one prompt (a chunk of 13, then one token at a
 * time) through path's model: [NP, V] into *out. */
static int logits(const char *path, struct kn_backend *be, int quant, float **out, int *V,
                  char *err, size_t errlen) {
  return wkt_prompt_logits(path, be, quant, NP, 13, out, V, err, errlen);
}

TH_TEST(quantization_at_load_gives_the_gguf_files_logits) {
  char dir[256], gguf[CM_ARRAY_LEN(types)][300], err[512] = "";
  make(dir, sizeof(dir), gguf);
  struct kn_backend *be = wkt_cpu_backend(2);
  float *ref = NULL; /* the bf16 model's: every type moves them */
  int Vr = 0;
  TH_REQUIRE(logits(dir, be, 0, &ref, &Vr, err, sizeof(err)) == 0);
  for (size_t i = 0; i < CM_ARRAY_LEN(types); i++) {
    float *a = NULL, *b = NULL;
    int Va = 0, Vb = 0;
    if (logits(dir, be, types[i].quant, &a, &Va, err, sizeof(err)) ||
        logits(gguf[i], be, 0, &b, &Vb, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "%s: %s", types[i].name, err);
      free(a), free(b);
      continue;
    }
    TH_CHECK_EQ_INT(Va, Vb);
    size_t n = (size_t)NP * (size_t)Va, bad = 0, moved = 0, finite = 0;
    for (size_t j = 0; j < n; j++) {
      bad += memcmp(&a[j], &b[j], sizeof(float)) != 0;
      moved += a[j] != ref[j];
      finite += isfinite(a[j]) != 0;
    }
    TH_CHECK(moved > n / 2 && finite == n);
    if (bad)
      th_fail(__FILE__, __LINE__, "%s: %zu of %zu logits differ from the GGUF file's",
              types[i].name, bad, n);
    free(a), free(b);
  }
  free(ref);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}

/* The tiny preset's rows (64, 128) are not whole 256-blocks: q4_k falls back
 * to Q5_0 as the file's matrices do, with the file's logits. */
TH_TEST(q4_k_falls_back_to_q5_0_as_the_file_does) {
  char dir[256], gguf[CM_ARRAY_LEN(types)][300], err[512] = "";
  make_preset(dir, sizeof(dir), gguf, "tiny", 0);
  struct kn_backend *be = wkt_cpu_backend(1);
  struct wk_model_opts o = wkt_small_opts(WK_QUANT_Q4_K);
  struct wk_model *m = NULL;
  TH_REQUIRE(wk_model_load(dir, be, &o, &m, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(m->embed.dt, KN_DTYPE_Q5_0);
  TH_CHECK_EQ_INT(m->layers[0].w_down.dt, KN_DTYPE_Q5_0);
  wk_model_free(m);
  float *a = NULL, *b = NULL;
  int Va = 0, Vb = 0;
  TH_REQUIRE(logits(dir, be, WK_QUANT_Q4_K, &a, &Va, err, sizeof(err)) == 0);
  TH_REQUIRE(logits(gguf[2], be, 0, &b, &Vb, err, sizeof(err)) == 0);
  TH_REQUIRE(Va == Vb);
  TH_CHECK(!memcmp(a, b, sizeof(float) * (size_t)NP * (size_t)Va));
  free(a), free(b);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}

/* Two ranks: every quantized matrix of a rank (rows cut, columns cut along
 * whole blocks, the vocabulary's rows) holds the bytes of the GGUF file's cut
 * on the same rank, in the same format. The ranks of one type agree (their
 * shard sums), and ranks whose cuts would overlap do not: q4_k's (512 and 256)
 * beside q8_0's (384 and 384), which the scheduler then refuses as a group
 * rather than summing columns 384-511 twice. */
TH_TEST(tensor_parallel_ranks_hold_the_gguf_files_cuts) {
  char dir[256], gguf[CM_ARRAY_LEN(types)][300], err[512] = "";
  make(dir, sizeof(dir), gguf);
  struct kn_backend *be = wkt_cpu_backend(1);
  uint64_t sum[CM_ARRAY_LEN(types)][2] = {{0}};
  for (size_t i = 0; i < CM_ARRAY_LEN(types); i++)
    for (int rank = 0; rank < 2; rank++) {
      struct wk_model_opts o = wkt_small_opts(types[i].quant);
      o.tp_rank = rank;
      o.tp_size = 2;
      struct wk_model *q = NULL, *g = NULL;
      int rc = wk_model_load(dir, be, &o, &q, err, sizeof(err));
      o.quantization = 0;
      if (!rc) rc = wk_model_load(gguf[i], be, &o, &g, err, sizeof(err));
      if (rc) {
        th_fail(__FILE__, __LINE__, "%s rank %d: %s", types[i].name, rank, err);
        wk_model_free(q);
        continue;
      }
      sum[i][rank] = wk_model_shard_sum(q);
      int n_checked = 0;
      for (int l = -1; l < wk_model_config(q)->n_layers; l++) {
        const struct wk_layer_w *a = l >= 0 ? &q->layers[l] : NULL,
                                *b = l >= 0 ? &g->layers[l] : NULL;
        const struct wk_w *ws[2][7] = {
            {l < 0 ? &q->embed : &a->wq, l < 0 ? NULL : &a->wk, l < 0 ? NULL : &a->wv,
             l < 0 ? NULL : &a->wo, l < 0 ? NULL : &a->w_gate, l < 0 ? NULL : &a->w_up,
             l < 0 ? NULL : &a->w_down},
            {l < 0 ? &g->embed : &b->wq, l < 0 ? NULL : &b->wk, l < 0 ? NULL : &b->wv,
             l < 0 ? NULL : &b->wo, l < 0 ? NULL : &b->w_gate, l < 0 ? NULL : &b->w_up,
             l < 0 ? NULL : &b->w_down}};
        for (int k = 0; k < 7; k++) {
          const struct wk_w *x = ws[0][k], *y = ws[1][k];
          if (!x) continue;
          if (x->dt != types[i].dt || y->dt != x->dt || x->rows != y->rows || x->cols != y->cols ||
              x->off != y->off ||
              memcmp(x->p, y->p, (size_t)x->rows * kn_row_bytes(x->dt, (size_t)x->cols))) {
            th_fail(__FILE__, __LINE__, "%s rank %d layer %d weight %d: %s [%d, %d] vs %s [%d, %d]",
                    types[i].name, rank, l, k, kn_dtype_name(x->dt), x->rows, x->cols,
                    kn_dtype_name(y->dt), y->rows, y->cols);
          }
          n_checked++;
        }
      }
      TH_CHECK_EQ_INT(n_checked, 1 + 7 * wk_model_config(q)->n_layers);
      /* 768 columns: Q8_0 and Q4_0 cut evenly, Q4_K in whole blocks */
      TH_CHECK_EQ_INT(q->layers[0].w_down.cols, types[i].dt != KN_DTYPE_Q4_K ? 384
                                                : rank                       ? 256
                                                                             : 512);
      wk_model_free(q);
      wk_model_free(g);
    }
  for (size_t i = 0; i < CM_ARRAY_LEN(types); i++)
    TH_CHECK(sum[i][0] == sum[i][1]);
  TH_CHECK(sum[0][1] != sum[2][0]); /* q8_0 beside q4_k */
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}

TH_TEST(quantization_refusals_are_clear) {
  char dir[256], gguf[CM_ARRAY_LEN(types)][300], err[512] = "";
  make(dir, sizeof(dir), gguf);
  struct kn_backend *be = wkt_cpu_backend(1);
  struct wk_model_opts o = wkt_small_opts(WK_QUANT_Q4_0);
  struct wk_model *m = NULL;
  TH_CHECK_EQ_INT(wk_model_load(gguf[0], be, &o, &m, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "--quantization q4_0") && strstr(err, "GGUF"));
  /* four ranks cannot cut the MLP's 768 columns (three blocks of 256) in
   * whole blocks: the file's Q4_K is refused, naming the width and the block.
   * At load, q4_k cuts them evenly (192) and takes Q5_0 for the down
   * projection alone, as for the attention output's 128 columns of 512. */
  o.tp_size = 4;
  for (o.tp_rank = 0; o.tp_rank < 2; o.tp_rank++) {
    err[0] = 0;
    o.quantization = 0;
    TH_CHECK(wk_model_load(gguf[2], be, &o, &m, err, sizeof(err)) != 0);
    TH_CHECK(strstr(err, "whole blocks of 256") != NULL);
    TH_CHECK(strstr(err, "intermediate_size = 768") != NULL);
    o.quantization = WK_QUANT_Q4_K;
    if (wk_model_load(dir, be, &o, &m, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "q4_k on rank %d of 4: %s", o.tp_rank, err);
      continue;
    }
    const struct wk_layer_w *l0 = &m->layers[0];
    TH_CHECK_EQ_INT(l0->w_down.dt, KN_DTYPE_Q5_0);
    TH_CHECK_EQ_INT(l0->w_down.cols, 192);
    TH_CHECK_EQ_INT(l0->wo.dt, KN_DTYPE_Q5_0);
    TH_CHECK_EQ_INT(l0->wo.cols, 128);
    TH_CHECK_EQ_INT(l0->w_gate.dt, KN_DTYPE_Q4_K);
    TH_CHECK_EQ_INT(l0->wq.dt, KN_DTYPE_Q4_K);
    wk_model_free(m);
    m = NULL;
  }
  o.quantization = WK_QUANT_Q4_K;
  /* a backend without block kernels (as a CUDA one whose block kernels failed
   * their check at creation is): the CPU less the bit */
  be->caps &= ~(unsigned)KN_CAP_BLOCK_WEIGHTS;
  o.tp_size = 1;
  o.tp_rank = 0;
  err[0] = 0;
  TH_CHECK_EQ_INT(wk_model_load(dir, be, &o, &m, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(strstr(err, "--quantization q4_k") && strstr(err, "no kernels for block formats"));
  be->caps |= KN_CAP_BLOCK_WEIGHTS;
  int q = -1;
  TH_CHECK_EQ_INT(wk_quantization_parse("q4_k", &q, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(q, WK_QUANT_Q4_K);
  TH_CHECK_EQ_INT(wk_quantization_parse("q3_k", &q, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "q3_k") && strstr(err, "q8_0, q4_0, q4_k"));
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}

/* A file of llama.cpp's IQ4_XS (its quantizer, from the k256 preset's f32
 * export: rows of whole 256-blocks, the MLP's 768 columns three blocks): two
 * tensor-parallel ranks cut its matrices along whole blocks (the down
 * projection's columns 512 and 256, as Q4_K's), and a backend without
 * KN_CAP_BLOCK_LOWBIT (a CUDA backend whose check failed those kernels) refuses it at
 * load, naming the tensor's type. */
TH_TEST(llamacpp_iq4_xs_file_cut_and_refused) {
  const char *no = th_llamacpp_lib();
  if (no) TH_SKIP(no);
  char dir[256], f32[300], q[300], err[512] = "";
  struct tl_tiny_opts to = {.arch = "gemma3", .preset = "k256", .vocab = 512, .ffn = 768};
  wkt_make_tiny(dir, sizeof(dir), &to, 7, MD_ST_BF16);
  snprintf(f32, sizeof(f32), "%s/f32.gguf", dir);
  snprintf(q, sizeof(q), "%s/iq4_xs.gguf", dir);
  wkt_lmserve("export-gguf", "--model", dir, "--out", f32, "--dtype", "f32");
  if (th_llamacpp_quantize(f32, q, TH_LLAMA_FTYPE_IQ4_XS, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s", err);
    wkt_rmdir(dir);
    return;
  }
  struct kn_backend *be = wkt_cpu_backend(1);
  for (int rank = 0; rank < 2; rank++) {
    struct wk_model_opts o = wkt_small_opts(0);
    o.tp_rank = rank;
    o.tp_size = 2;
    struct wk_model *m = NULL;
    if (wk_model_load(q, be, &o, &m, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "rank %d: %s", rank, err);
      continue;
    }
    TH_CHECK_EQ_INT(m->layers[0].w_gate.dt, KN_DTYPE_IQ4_XS);
    TH_CHECK_EQ_INT(m->layers[0].w_down.dt, KN_DTYPE_IQ4_XS);
    TH_CHECK_EQ_INT(m->layers[0].w_down.cols, rank ? 256 : 512);
    wk_model_free(m);
  }
  be->caps &= ~(unsigned)KN_CAP_BLOCK_LOWBIT;
  struct wk_model_opts o = wkt_small_opts(0);
  struct wk_model *m = NULL;
  err[0] = 0;
  TH_CHECK_EQ_INT(wk_model_load(q, be, &o, &m, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(strstr(err, "is iq4_xs") && strstr(err, "no kernels for q2_k, q3_k, iq4_nl and iq4_xs"));
  be->caps |= KN_CAP_BLOCK_LOWBIT;
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}
