/* test-wk-gguf-g4.c — Gemma 4 GGUF files round trip: a generated checkpoint
 * (the tiny-e preset: per-layer inputs, KV-shared layers, the double-wide MLP,
 * K as V on full layers, layer scalars; the tiny-dense preset: none of those
 * and no final softcap) written by `lmserve export-gguf` (bf16, f32) and
 * `lmserve quantize` (q8_0), read back as a model: the same config plan as the
 * checkpoint's, and the same logits bit for bit (the bf16 and f32 files as the
 * safetensors checkpoint; the q8_0 file as the checkpoint quantized at load).
 * Then the metadata made bad one key at a time (the file rebuilt with a key
 * dropped, changed or added, or rope_freqs changed): each is a clear error
 * naming the key or tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "model/md-gguf.h"
#include "tests/harness/th-buf.h"
#include "tests/harness/th-gguf.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "tools/tl-tiny-spec.h"
#include "worker/wk-model.h"

/* A checkpoint of preset (vocabulary 512, bf16) in dir, and the files
 * out[0..2]: export-gguf's bf16 and f32, quantize's q8_0. */
static void make(char *dir, size_t n, const char *preset, int moe, char out[3][300]) {
  struct tl_tiny_opts o = {.arch = "gemma4", .preset = preset, .vocab = 512, .moe = moe};
  wkt_make_tiny(dir, n, &o, 11, MD_ST_BF16);
  static const char *names[3] = {"bf16", "f32", "q8_0"};
  for (int i = 0; i < 3; i++)
    snprintf(out[i], 300, "%s/m-%s.gguf", dir, names[i]);
  wkt_lmserve("export-gguf", "--model", dir, "--out", out[0]);
  wkt_lmserve("export-gguf", "--model", dir, "--out", out[1], "--dtype", "f32");
  wkt_lmserve("quantize", dir, out[2], "q8_0");
}

#define NP 80 /* past the 64-token window */

/* Every position's logits of one prompt (a chunk of 37, then one token at a
 * time) through path's model: [NP, V] into *out. */
static int logits(const char *path, struct kn_backend *be, int quant, float **out, int *V,
                  char *err, size_t errlen) {
  return wkt_prompt_logits(path, be, quant, NP, 37, out, V, err, errlen);
}

/* The plan of a GGUF file's config is the checkpoint's. */
static void same_config(const char *dir, const char *gguf) {
  struct md_config *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
  char err[512];
  TH_REQUIRE(a && b);
  TH_REQUIRE(md_config_load(dir, a, err, sizeof(err)) == 0);
  if (md_config_load(gguf, b, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: %s", gguf, err);
    free(a), free(b);
    return;
  }
  TH_CHECK_EQ_INT(b->arch, MD_ARCH_GEMMA4);
  TH_CHECK_EQ_INT(b->gguf, 1);
  TH_CHECK_EQ_INT(a->vocab, b->vocab);
  TH_CHECK_EQ_INT(a->hidden, b->hidden);
  TH_CHECK_EQ_INT(a->n_layers, b->n_layers);
  TH_CHECK_EQ_INT(a->n_heads, b->n_heads);
  TH_CHECK_EQ_INT(a->head_dim, b->head_dim);
  TH_CHECK_EQ_INT(a->global_head_dim, b->global_head_dim);
  TH_CHECK_EQ_INT(a->sliding_window, b->sliding_window);
  TH_CHECK_EQ_INT(a->n_kv_shared, b->n_kv_shared);
  TH_CHECK_EQ_INT(a->ple_dim, b->ple_dim);
  TH_CHECK_EQ_INT(a->ple_vocab, b->ple_vocab);
  TH_CHECK_EQ_INT(a->tie_embeddings, b->tie_embeddings);
  TH_CHECK_EQ_INT(a->moe, b->moe);
  TH_CHECK_EQ_INT(a->n_experts, b->n_experts);
  TH_CHECK_EQ_INT(a->top_k_experts, b->top_k_experts);
  TH_CHECK_EQ_INT(a->moe_ffn, b->moe_ffn);
  TH_CHECK(a->attn_scale == b->attn_scale && a->final_softcap == b->final_softcap);
  TH_CHECK((float)a->eps == (float)b->eps);
  for (int k = 0; k < 2; k++) {
    TH_CHECK_EQ_INT(a->rope[k].rot_pairs, b->rope[k].rot_pairs);
    TH_CHECK(a->rope[k].theta == b->rope[k].theta && a->rope[k].factor == b->rope[k].factor);
  }
  for (int i = 0; i < a->n_layers; i++) {
    const struct md_layer_cfg *x = &a->layers[i], *y = &b->layers[i];
    if (x->kind != y->kind || x->head_dim != y->head_dim || x->n_kv_heads != y->n_kv_heads ||
        x->k_eq_v != y->k_eq_v || x->kv_shared != y->kv_shared || x->kv_source != y->kv_source ||
        x->ffn_dim != y->ffn_dim)
      th_fail(__FILE__, __LINE__, "%s: layer %d planned otherwise than the checkpoint's", gguf, i);
  }
  free(a), free(b);
}

/* a and b (n floats each) bit for bit; their count of differences. */
static size_t differ(const float *a, const float *b, size_t n) {
  size_t bad = 0;
  for (size_t j = 0; j < n; j++)
    bad += memcmp(&a[j], &b[j], sizeof(float)) != 0;
  return bad;
}

static void round_trip(const char *preset, int moe) {
  char dir[256], g[3][300], err[512] = "";
  make(dir, sizeof(dir), preset, moe, g);
  for (int i = 0; i < 3; i++)
    same_config(dir, g[i]);
  struct kn_backend *be = wkt_cpu_backend(2);
  float *ref = NULL, *q = NULL;
  int V = 0, Vg = 0;
  TH_REQUIRE(logits(dir, be, 0, &ref, &V, err, sizeof(err)) == 0);
  TH_REQUIRE(logits(dir, be, WK_QUANT_Q8_0, &q, &V, err, sizeof(err)) == 0);
  size_t n = (size_t)NP * (size_t)V;
  TH_CHECK(differ(ref, q, n) > n / 2); /* the quantization moves them */
  for (int i = 0; i < 3; i++) {
    float *got = NULL;
    if (logits(g[i], be, 0, &got, &Vg, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "%s %s: %s", preset, g[i], err);
      continue;
    }
    TH_CHECK_EQ_INT(Vg, V);
    size_t bad = differ(i == 2 ? q : ref, got, n);
    if (bad) th_fail(__FILE__, __LINE__, "%s %s: %zu of %zu logits differ", preset, g[i], bad, n);
    free(got);
  }
  free(ref), free(q);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}

TH_TEST(gemma4_gguf_with_per_layer_inputs_and_shared_kv_gives_the_checkpoints_logits) {
  round_trip("tiny-e", 0);
}

TH_TEST(dense_gemma4_gguf_gives_the_checkpoints_logits) {
  round_trip("tiny-dense", 0);
}

/* MoE: the router, its scales and the expert stacks under llama.cpp's names;
 * the q8_0 file's stacks in Q8_0 as --quantization q8_0 quantizes them */
TH_TEST(moe_gemma4_gguf_gives_the_checkpoints_logits) {
  round_trip("tiny-dense", 1);
}

/* ---- bad metadata: the file rebuilt with one change ------------------------------------ */

/* One change: the key `key` dropped (type < 0), or set to (or added as) a u32
 * (type MD_GGUF_U32) or f32 (MD_GGUF_F32) of value v, or a bool array of n
 * true values (MD_GGUF_ARRAY); or, with key NULL, rope_freqs.weight[1] set to v. */
struct change {
  const char *key;
  int type;
  double v;
};

static void put_value(struct th_buf *b, const void *val) {
  const struct change *c = val;
  th_buf_u32(b, (uint32_t)c->type);
  if (c->type == MD_GGUF_U32) {
    th_buf_u32(b, (uint32_t)c->v);
  } else if (c->type == MD_GGUF_F32) {
    float f = (float)c->v;
    th_buf_put(b, &f, 4);
  } else {
    th_buf_u32(b, MD_GGUF_BOOL);
    th_buf_u64(b, (uint64_t)c->v);
    for (int i = 0; i < (int)c->v; i++)
      th_buf_put(b, "\1", 1);
  }
}

/* g's file (bytes[len]) with change c, as a new image. */
static struct th_buf rebuild(const struct md_gguf *g, const uint8_t *bytes, size_t len,
                             const struct change *c) {
  size_t base;
  struct th_gguf_pair p = {c->key, c->type < 0, put_value, c};
  struct th_gguf_edit e = th_gguf_pair_edit(g, &p);
  struct th_buf b = th_gguf_rebuild(g, bytes, len, &e, &base);
  if (!c->key) {
    const struct md_gguf_tensor *t = md_gguf_find_tensor(g, "rope_freqs.weight");
    TH_REQUIRE(t != NULL);
    float f = (float)c->v;
    memcpy(b.p + base + t->offset + 4, &f, 4);
  }
  return b;
}

/* The file with change c gives an error with want in it. */
static void expect_bad(const struct md_gguf *orig, const uint8_t *bytes, size_t len,
                       const struct change *c, const char *want) {
  char err[512] = "";
  struct th_buf b = rebuild(orig, bytes, len, c);
  struct md_gguf *gg = NULL;
  struct md_config *cfg = calloc(1, sizeof(*cfg));
  TH_REQUIRE(cfg != NULL);
  int rc = md_gguf_open_mem(b.p, b.n, "bad.gguf", &gg, err, sizeof(err));
  if (!rc) rc = md_config_from_gguf(gg, cfg, err, sizeof(err));
  if (!rc || !strstr(err, want))
    th_fail(__FILE__, __LINE__, "%s: rc %d, \"%s\" (want \"%s\")", c->key ? c->key : "rope_freqs",
            rc, err, want);
  else
    printf("# %s\n", err);
  md_gguf_close(gg);
  free(cfg);
  free(b.p);
}

/* The config of the file rebuilt with change c, which must read (malloc'd). */
static struct md_config *config_after(const struct md_gguf *orig, const uint8_t *bytes, size_t len,
                                      const struct change *c) {
  char err[512];
  struct th_buf b = rebuild(orig, bytes, len, c);
  struct md_gguf *gg = NULL;
  struct md_config *cfg = calloc(1, sizeof(*cfg));
  TH_REQUIRE(cfg && md_gguf_open_mem(b.p, b.n, "changed.gguf", &gg, err, sizeof(err)) == 0);
  if (md_config_from_gguf(gg, cfg, err, sizeof(err)))
    th_fail(__FILE__, __LINE__, "%s: %s", c->key, err);
  md_gguf_close(gg);
  free(b.p);
  return cfg;
}

TH_TEST(bad_gemma4_metadata_is_a_clear_error_naming_the_key) {
  char dir[256], g[3][300];
  make(dir, sizeof(dir), "tiny-e", 0, g);
  struct md_gguf *orig = NULL;
  size_t len;
  uint8_t *bytes = th_gguf_slurp(g[0], &len, &orig);
  static const struct {
    struct change c;
    const char *want; /* in the error */
  } cases[] = {
      {{"gemma4.attention.sliding_window_pattern", -1, 0},
       "gemma4.attention.sliding_window_pattern missing"},
      {{"gemma4.attention.sliding_window_pattern", MD_GGUF_ARRAY, 5},
       "gemma4.attention.sliding_window_pattern must hold one bool per layer"},
      /* every layer sliding: layer 3 had K as V, which only full layers may */
      {{"gemma4.attention.sliding_window_pattern", MD_GGUF_ARRAY, 6},
       "blk.3.attn_v.weight missing on a sliding layer"},
      {{"gemma4.attention.key_length_swa", -1, 0}, "gemma4.attention.key_length_swa missing"},
      {{"gemma4.attention.key_length", -1, 0}, "gemma4.attention.key_length missing"},
      {{"gemma4.attention.value_length", MD_GGUF_U32, 32}, "gemma4.attention.value_length"},
      {{"gemma4.embedding_length_per_layer_input", -1, 0},
       "gemma4.embedding_length_per_layer_input missing"},
      {{"gemma4.embedding_length_per_layer_input", MD_GGUF_U32, 8},
       "gemma4.embedding_length_per_layer_input is 8"},
      {{"gemma4.attention.sliding_window", -1, 0}, "gemma4.attention.sliding_window missing"},
      {{"gemma4.attention.layer_norm_rms_epsilon", -1, 0},
       "gemma4.attention.layer_norm_rms_epsilon missing"},
      {{"gemma4.attention.shared_kv_layers", MD_GGUF_U32, 6}, "gemma4.attention.shared_kv_layers"},
      {{"gemma4.attention.head_count_kv", MD_GGUF_U32, 3}, "gemma4.attention.head_count_kv"},
      {{"gemma4.feed_forward_length", MD_GGUF_U32, 0}, "gemma4.feed_forward_length"},
      {{"gemma4.rope.dimension_count_swa", MD_GGUF_U32, 16}, "gemma4.rope.dimension_count_swa"},
      {{"gemma4.rope.dimension_count", MD_GGUF_U32, 32}, "gemma4.rope.dimension_count"},
      {{"gemma4.expert_count", MD_GGUF_U32, 4},
       "gemma4.expert_count is 4 but no layer has blk.N.ffn_gate_inp.weight"},
      {{"gemma4.block_count", MD_GGUF_U32, 0}, "gemma4.block_count"},
      {{"gemma4.context_length", -1, 0}, "gemma4.context_length missing"},
      {{NULL, 0, 0.5}, "rope_freqs.weight[1] is 0.5"},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++)
    expect_bad(orig, bytes, len, &cases[i].c, cases[i].want);
  /* the unchanged rebuild reads (the rebuilding itself is sound) */
  struct change none = {"x.unused", -1, 0};
  free(config_after(orig, bytes, len, &none));
  md_gguf_close(orig);
  free(bytes);
  wkt_rmdir(dir);

  /* KV-shared layers where llama.cpp's gemma4 would read other layers than ours: the
     dense preset's last layers are sliding, sliding, full */
  make(dir, sizeof(dir), "tiny-dense", 0, g);
  bytes = th_gguf_slurp(g[0], &len, &orig);
  struct change shared = {"gemma4.attention.shared_kv_layers", MD_GGUF_U32, 2};
  expect_bad(orig, bytes, len, &shared, "llama.cpp's gemma4 lets KV-shared sliding layers read");
  md_gguf_close(orig);
  free(bytes);
  wkt_rmdir(dir);

  /* an MoE file's keys */
  make(dir, sizeof(dir), "tiny-dense", 1, g);
  bytes = th_gguf_slurp(g[0], &len, &orig);
  static const struct {
    struct change c;
    const char *want;
  } moe[] = {
      {{"gemma4.expert_count", -1, 0}, "gemma4.expert_count missing or not 1..4096"},
      {{"gemma4.expert_count", MD_GGUF_U32, 5000}, "gemma4.expert_count missing or not 1..4096"},
      {{"gemma4.expert_used_count", -1, 0}, "gemma4.expert_used_count missing or not 1..4"},
      {{"gemma4.expert_used_count", MD_GGUF_U32, 5},
       "gemma4.expert_used_count missing or not 1..4"},
      {{"gemma4.expert_feed_forward_length", MD_GGUF_U32, 0},
       "gemma4.expert_feed_forward_length missing or out of range"},
  };
  for (size_t i = 0; i < CM_ARRAY_LEN(moe); i++)
    expect_bad(orig, bytes, len, &moe[i].c, moe[i].want);
  /* without expert_feed_forward_length, the width of blk.0.ffn_down_exps */
  struct change no_i = {"gemma4.expert_feed_forward_length", -1, 0};
  struct md_config *cfg = config_after(orig, bytes, len, &no_i);
  TH_CHECK(cfg->moe && cfg->n_experts == 4 && cfg->top_k_experts == 2 && cfg->moe_ffn == 32);
  free(cfg);
  md_gguf_close(orig);
  free(bytes);
  wkt_rmdir(dir);
}
