/* test-wk-tp.c — tensor parallelism at the model level: the tiny Gemma 3, Gemma 4
 * and Gemma 4 MoE checkpoints run by 2 and 4 ranks (separate processes joined by the
 * CPU backend's shared-memory collectives) give the logits of one rank within
 * 1e-3 of their range (the all-reduce sums in another order), and the same greedy
 * tokens from the vocab-parallel head's merged (max, argmax) pairs, where a token may
 * differ only at a near-tie of the single-rank logits. Sampled rows (greedy with
 * logprobs, seeded top-k and top-p draws with penalties), which the ranks decide from
 * each other's candidates without gathering the logits, give the same tokens and
 * logprobs within 0.02; so do models quantized to FP8 at load, and GGUF files whose MLP or
 * experts the ranks cut unevenly in whole blocks. Also: sizes that cannot split a
 * dimension are refused at load with its name. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "tests/harness/th-llamacpp.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-greedy.h"
#include "worker/wk-kv.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"

#define NA    48 /* tokens of the first prompt */
#define NB    20 /* tokens of the second */
#define CHUNK 16
#define MAXV  512

struct result {
  float logits[(NA + NB) * MAXV]; /* every position's logits: a's rows, then b's */
  int32_t greedy[NA + NB];        /* the head's greedy token at every position */
  int32_t sampled[NA + NB];       /* a sampled token at every position (sample_params) */
  float logprob[NA + NB];         /* its raw logprob */
  int32_t top1[NA + NB];          /* the first of its top logprobs */
};

static const int32_t pen_ids[] = {2, 7, 100, 130, 260, 300, 411, -1};
static const int32_t pen_counts[] = {0, 1, 2, 1, 0, 3, 1, 0};

/* Row i's params in the sampled pass: greedy with logprobs, seeded top-k, seeded
 * top-p, each with penalties on ids spread over every rank's slice. */
static void sample_params(struct kn_sample_params *p, int i) {
  kn_sample_params_default(p);
  p->n_logprobs = 2;
  p->seed = 1000u + (uint64_t)i;
  p->counter = (uint64_t)i;
  p->temperature = i % 3 ? 0.9f : 0.0f;
  if (i % 3 == 1) p->top_k = 20;
  if (i % 3 == 2) p->top_p = 0.8f;
  p->pen_ids = pen_ids;
  p->pen_counts = pen_counts;
  p->n_pen = (int)(sizeof pen_ids / sizeof pen_ids[0]);
  p->repetition_penalty = 1.2f;
  p->frequency_penalty = 0.3f;
}

static void make_prompt(int32_t *p, int n, int V, uint32_t seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (int32_t)((seed >> 8) % (uint32_t)V);
  }
  p[0] = 2;
}

/* Both prompts in one batch, CHUNK tokens a step, every position's logits; then the
 * same again through fresh blocks with greedy sampling at every position. */
static int run(struct wk_model *m, struct result *r, int V) {
  int32_t pa[NA], pb[NB];
  make_prompt(pa, NA, V, 11);
  make_prompt(pb, NB, V, 12);
  const int32_t *toks[2] = {pa, pb};
  int lens[2] = {NA, NB}, row0[2] = {0, NA};
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  static float out[2 * CHUNK * MAXV];
  struct kn_sample_out so[2 * CHUNK];
  struct kn_sample_params sp[2 * CHUNK], sp2[2 * CHUNK];
  memset(sp, 0, sizeof sp);
  for (int i = 0; i < 2 * CHUNK; i++) {
    sp[i].top_p = 1.0f;
    sp[i].repetition_penalty = 1.0f;
    sp[i].n_logprobs = -1;
    sample_params(&sp2[i], i);
  }
  char err[256];
  for (int pass = 0; pass < 3; pass++) {
    struct wk_page_alloc pa_;
    if (wk_page_alloc_init(&pa_, wk_model_n_pages(m))) return -1;
    struct wk_seq_blocks blk[2];
    memset(blk, 0, sizeof blk);
    for (int done = 0; done < NA; done += CHUNK) {
      struct wk_seq_input in[2];
      int k = 0;
      for (int s = 0; s < 2; s++) {
        if (done >= lens[s]) continue;
        int n = lens[s] - done < CHUNK ? lens[s] - done : CHUNK;
        if (wk_seq_blocks_reserve(&blk[s], kv, &pa_, done + n)) return -1;
        memset(&in[k], 0, sizeof in[k]);
        in[k].tokens = toks[s] + done;
        in[k].n_tokens = n;
        in[k].pos0 = done;
        in[k].n_out = n;
        wkt_seq_pages(&in[k], kv, &blk[s]);
        k++;
      }
      struct wk_batch b = {.seqs = in, .n_seqs = k};
      if (pass == 0)
        b.logits = out;
      else
        b.sampled = so, b.sample = pass == 1 ? sp : sp2;
      int rc = wk_model_forward(m, &b, err, sizeof err);
      if (rc) {
        fprintf(stderr, "forward: %s\n", err);
        return rc;
      }
      int row = 0;
      for (int j = 0; j < k; j++) {
        int s = in[j].tokens == pa + done ? 0 : 1;
        for (int t = 0; t < in[j].n_tokens; t++, row++) {
          int pos = row0[s] + done + t;
          if (pass == 0)
            memcpy(r->logits + (size_t)pos * V, out + (size_t)row * V, sizeof(float) * (size_t)V);
          else if (pass == 1)
            r->greedy[pos] = so[row].token;
          else {
            r->sampled[pos] = so[row].token;
            r->logprob[pos] = so[row].logprob;
            r->top1[pos] = so[row].n_top ? so[row].top_ids[0] : -1;
          }
        }
      }
    }
    for (int s = 0; s < 2; s++)
      wk_seq_blocks_release(&blk[s], kv, &pa_);
    wk_page_alloc_free(&pa_);
  }
  return 0;
}

/* 1: the models quantize their linear layers to FP8 at load (--quantization fp8, on
 * the CPU's reference kernels): every rank's cut of a weight split by columns takes
 * the scales of its whole rows, so the ranks hold the unsplit model's codes */
static int g_fp8;
static char g_tmp[512]; /* the test's folder, where rank 0 leaves its result */

static int load(const char *dir, struct kn_backend *be, int rank, int world, struct wk_model **m,
                char *err, size_t errlen) {
  struct wk_model_opts o = {.max_batch_tokens = 2 * CHUNK,
                            .max_seqs = 2,
                            .kv_tokens = 256,
                            .quiet = 1,
                            .tp_rank = rank,
                            .tp_size = world,
                            .kv_dtype = 1 /* f32 */,
                            .quantization = g_fp8 ? WK_QUANT_FP8 : WK_QUANT_NONE,
                            .fp8_reference = g_fp8};
  return wk_model_load(dir, be, &o, m, err, errlen);
}

/* One rank's process: joins the group, loads its shard, runs; rank 0 writes the
 * result to `path`. Exits 0 on success. */
static _Noreturn void rank_main(const char *dir, const struct kn_comm_id *id, int rank, int world,
                                const char *path) {
  struct kn_backend *be = NULL;
  struct wk_model *m = NULL;
  char err[256];
  int rc = kn_cpu_backend_create(1, &be);
  if (!rc) rc = kn_comm_join(be, id, rank, world, 10000);
  if (!rc) rc = load(dir, be, rank, world, &m, err, sizeof err);
  if (rc) fprintf(stderr, "rank %d: %s\n", rank, cm_strerror(rc));
  static struct result r;
  if (!rc) rc = run(m, &r, wk_model_config(m)->vocab);
  if (!rc && rank == 0) {
    FILE *f = fopen(path, "wb");
    rc = !f || fwrite(&r, sizeof r, 1, f) != 1;
    if (f) fclose(f);
  }
  wk_model_free(m);
  kn_backend_destroy(be);
  _exit(rc ? 1 : 0);
}

/* The model at dir (a folder or a GGUF file; `arch` names it) on one rank against
 * 2 .. max_world ranks. */
static void check_tp_at(const char *dir, const char *arch, int max_world) {
  static struct result ref, got;
  struct kn_backend *be = NULL;
  struct wk_model *m = NULL;
  char err[256] = "";
  TH_REQUIRE(kn_cpu_backend_create(1, &be) == 0);
  TH_REQUIRE(load(dir, be, 0, 1, &m, err, sizeof err) == 0);
  int V = wk_model_config(m)->vocab;
  TH_REQUIRE(V <= MAXV);
  TH_REQUIRE(run(m, &ref, V) == 0);
  wk_model_free(m);
  float lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < (size_t)(NA + NB) * (size_t)V; i++) {
    lo = fminf(lo, ref.logits[i]);
    hi = fmaxf(hi, ref.logits[i]);
  }
  for (int world = 2; world <= max_world; world *= 2) {
    struct kn_comm_id id;
    TH_REQUIRE(kn_comm_id_new(be, &id) == 0);
    char path[600];
    snprintf(path, sizeof path, "%s/tp-result", g_tmp);
    pid_t pids[4];
    for (int r = 0; r < world; r++) {
      pids[r] = fork();
      TH_REQUIRE(pids[r] >= 0);
      if (pids[r] == 0) rank_main(dir, &id, r, world, path);
    }
    int ok = 1;
    for (int r = 0; r < world; r++) {
      int st = 0;
      waitpid(pids[r], &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st)) ok = 0;
    }
    if (!ok) {
      th_fail(__FILE__, __LINE__, "%s: a rank of %d failed", arch, world);
      continue;
    }
    FILE *f = fopen(path, "rb");
    TH_REQUIRE(f && fread(&got, sizeof got, 1, f) == 1);
    fclose(f);
    unlink(path);
    float worst = 0;
    for (size_t i = 0; i < (size_t)(NA + NB) * (size_t)V; i++)
      worst = fmaxf(worst, fabsf(got.logits[i] - ref.logits[i]));
    /* FP8's matmul rounds its inputs to bf16, where the all-reduce's other order of
     * sums now and then lands on the other side of a rounding: looser */
    float tol = g_fp8 ? 1e-2f : 1e-3f;
    if (!(worst <= tol * (hi - lo)))
      th_fail(__FILE__, __LINE__, "%s at size %d: logits differ by %g (range %g)", arch, world,
              (double)worst, (double)(hi - lo));
    int flips = 0;
    for (int p = 0; p < NA + NB; p++) {
      const float *row = ref.logits + (size_t)p * V;
      int32_t best = wk_argmax(row, V);
      if (got.greedy[p] == best) continue;
      /* a near-tie of the single-rank logits may flip */
      float gap = row[best] - row[got.greedy[p]];
      if (gap < tol * (hi - lo))
        flips++;
      else
        th_fail(__FILE__, __LINE__, "%s at size %d: position %d: greedy %d, expected %d (gap %g)",
                arch, world, p, got.greedy[p], best, (double)gap);
    }
    TH_CHECK(flips <= 2);
    int differ = 0;
    for (int p = 0; p < NA + NB; p++) {
      if (got.sampled[p] != ref.sampled[p] || got.top1[p] != ref.top1[p]) {
        differ++; /* a draw at a boundary the rounding moved, or a near-tie */
        continue;
      }
      if (!(fabsf(got.logprob[p] - ref.logprob[p]) <= 0.02f))
        th_fail(__FILE__, __LINE__, "%s at size %d: position %d: logprob %g, expected %g", arch,
                world, p, (double)got.logprob[p], (double)ref.logprob[p]);
    }
    if (differ > (g_fp8 ? 8 : 2))
      th_fail(__FILE__, __LINE__, "%s at size %d: %d of %d sampled tokens differ", arch, world,
              differ, NA + NB);
  }
  kn_backend_destroy(be);
}

static void check_tp(const char *arch, int moe) {
  char dir[512];
  TH_REQUIRE(wkt_make_model(dir, sizeof dir, arch, moe, 0, MD_ST_BF16, 5) == 0);
  snprintf(g_tmp, sizeof g_tmp, "%s", dir);
  check_tp_at(dir, arch, 4);
  wkt_rmdir(dir);
}

TH_TEST(tp_gemma3_matches_one_rank) {
  check_tp("gemma3", 0);
}

TH_TEST(tp_gemma4_matches_one_rank) {
  check_tp("gemma4", 0);
}

TH_TEST(tp_gemma4_moe_matches_one_rank) {
  check_tp("gemma4", 1);
}

TH_TEST(tp_fp8_weights_match_one_rank) {
  g_fp8 = 1;
  check_tp("gemma3", 0);
  check_tp("gemma4", 0);
  g_fp8 = 0;
}

/* A GGUF file from the checkpoint `to` builds: `lmserve quantize` writes it in
 * `type`, or, with llama_ftype, llama.cpp's quantizer from lmserve's f32 export;
 * its down projections (the experts' when moe) are columns of three blocks, layer
 * 0's of format dt: two ranks hold two blocks and one of every one (and the
 * matching rows of the gate and up) and give the one rank's logits; four ranks
 * cannot cut three blocks, and the error names `dim` and the block. */
static void check_uneven_cut(const struct tl_tiny_opts *to, const char *type, int llama_ftype,
                             enum kn_dtype dt, const char *dim, const char *label) {
  char dir[512], q[600], src[600], err[256] = "";
  wkt_make_tiny(dir, sizeof dir, to, 5, MD_ST_BF16);
  snprintf(g_tmp, sizeof g_tmp, "%s", dir);
  snprintf(q, sizeof q, "%s/%s.gguf", dir, type);
  snprintf(src, sizeof src, "%s/f32.gguf", dir);
  if (llama_ftype)
    wkt_lmserve("export-gguf", "--model", dir, "--out", src, "--dtype", "f32");
  else
    wkt_lmserve("quantize", dir, q, (char *)type);
  if (llama_ftype && th_llamacpp_quantize(src, q, llama_ftype, err, sizeof err)) {
    th_fail(__FILE__, __LINE__, "%s", err);
    th_stop();
  }
  int block = kn_block_elems(dt);
  struct kn_backend *be = NULL;
  struct wk_model *m = NULL;
  TH_REQUIRE(kn_cpu_backend_create(1, &be) == 0);
  for (int r = 0; r < 2; r++) {
    TH_REQUIRE(load(q, be, r, 2, &m, err, sizeof err) == 0);
    const struct wk_layer_w *l = &m->layers[0];
    const struct wk_w *down = to->moe ? &l->experts_down : &l->w_down;
    int held = (r ? 1 : 2) * block; /* the gate and up rows: as many of each */
    TH_CHECK_EQ_INT(down->dt, dt);
    TH_CHECK_EQ_INT(down->cols, held);
    TH_CHECK_EQ_INT(down->off, r ? 2 * block : 0);
    TH_CHECK_EQ_INT(to->moe ? l->experts_gate_up.rows : l->w_gate.rows, (to->moe ? 2 : 1) * held);
    wk_model_free(m);
    m = NULL;
  }
  TH_CHECK_EQ_INT(load(q, be, 0, 4, &m, err, sizeof err), CM_ERR_INVAL);
  char whole[64];
  snprintf(whole, sizeof whole, "whole blocks of %d", block);
  if (!strstr(err, dim) || !strstr(err, whole))
    th_fail(__FILE__, __LINE__, "%s on four ranks: %s", label, err);
  kn_backend_destroy(be);
  check_tp_at(q, label, 2);
  wkt_rmdir(dir);
}

/* Gemma 3's MLP of 768 columns in Q4_K (three blocks of 256): 512 and 256. */
TH_TEST(tp_gguf_blocks_cut_unevenly_match_one_rank) {
  struct tl_tiny_opts to = {.arch = "gemma3", .preset = "k256", .vocab = 512, .ffn = 768};
  check_uneven_cut(&to, "q4_k", 0, KN_DTYPE_Q4_K, "intermediate_size = 768", "gemma3 k256 q4_k");
}

/* The same checkpoint in llama.cpp's own Q4_K_M (its quantizer, the npm package's
 * libllama): down projections of Q4_K (layer 0's) and of Q6_K (layers 2 and 5, its
 * choice for six layers), each layer's cut in its own blocks. */
TH_TEST(tp_llamacpp_q4_k_m_cut_unevenly_matches_one_rank) {
  const char *no = th_llamacpp_lib();
  if (no) TH_SKIP(no);
  struct tl_tiny_opts to = {.arch = "gemma3", .preset = "k256", .vocab = 512, .ffn = 768};
  check_uneven_cut(&to, "q4_k_m", TH_LLAMA_FTYPE_Q4_K_M, KN_DTYPE_Q4_K, "intermediate_size = 768",
                   "gemma3 k256, llama.cpp's q4_k_m");
}

/* Gemma 4's experts 96 wide in Q8_0 (three blocks of 32): 64 and 32. */
TH_TEST(tp_gguf_experts_cut_unevenly_match_one_rank) {
  struct tl_tiny_opts to = {
      .arch = "gemma4", .preset = "tiny-dense", .vocab = 512, .moe = 1, .moe_ffn = 96};
  check_uneven_cut(&to, "q8_0", 0, KN_DTYPE_Q8_0, "moe_intermediate_size = 96",
                   "gemma4 tiny-dense moe q8_0");
}

TH_TEST(tp_refuses_what_cannot_split) {
  char dir[512], err[256] = "";
  TH_REQUIRE(wkt_make_model(dir, sizeof dir, "gemma3", 0, 0, MD_ST_BF16, 5) == 0);
  struct kn_backend *be = NULL;
  struct wk_model *m = NULL;
  TH_REQUIRE(kn_cpu_backend_create(1, &be) == 0);
  /* 4 query heads over 8 ranks */
  TH_CHECK_EQ_INT(load(dir, be, 0, 8, &m, err, sizeof err), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "num_attention_heads") != NULL);
  TH_CHECK_EQ_INT(load(dir, be, 3, 2, &m, err, sizeof err), CM_ERR_INVAL);
  TH_CHECK(m == NULL);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}
