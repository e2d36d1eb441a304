/* test-wk-shard.c — per-rank shapes under tensor parallelism: heads, KV heads
 * (split or replicated), MLP and expert widths (cut in whole blocks of their
 * formats where an even cut would split one), vocabulary rows, and the refusals
 * that name the dimension which cannot be split. */
#include <stdio.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "tests/harness/th.h"
#include "tools/tl-tiny-spec.h"
#include "worker/wk-shard.h"

/* A gemma3_text config with the given head counts, widths and vocabulary. */
static void make(struct md_config *c, int nh, int kvh, int ffn, int vocab) {
  char json[1024], err[256] = "";
  snprintf(json, sizeof json,
           "{\"model_type\":\"gemma3_text\",\"vocab_size\":%d,\"hidden_size\":640,"
           "\"intermediate_size\":%d,\"num_hidden_layers\":6,\"num_attention_heads\":%d,"
           "\"num_key_value_heads\":%d,\"head_dim\":256,\"query_pre_attn_scalar\":256,"
           "\"sliding_window\":512,\"sliding_window_pattern\":6,\"max_position_embeddings\":32768,"
           "\"rms_norm_eps\":1e-06}",
           vocab, ffn, nh, kvh);
  int rc = md_config_parse(json, strlen(json), c, err, sizeof err);
  if (rc) th_fail(__FILE__, __LINE__, "config: %s", err);
}

/* Sharding the config make() writes for (nh, kvh, ffn, vocab) as rank of size
 * is refused, with an error that names `names` (NULL: whatever it says). */
static void expect_refused(int nh, int kvh, int ffn, int vocab, int rank, int size,
                           const char *names) {
  struct md_config c, l;
  struct wk_shard_plan p;
  char err[256] = "";
  make(&c, nh, kvh, ffn, vocab);
  int rc = wk_config_shard(&c, rank, size, NULL, &l, &p, err, sizeof err);
  if (rc != CM_ERR_INVAL || (names && !strstr(err, names)))
    th_fail(__FILE__, __LINE__, "%d heads, %d KV heads, ffn %d, vocab %d, rank %d of %d: %d '%s'",
            nh, kvh, ffn, vocab, rank, size, rc, err);
}

TH_TEST(shard_world_one_is_the_full_model) {
  struct md_config c, l;
  struct wk_shard_plan p;
  char err[256];
  make(&c, 4, 1, 2048, 262144);
  TH_REQUIRE(wk_config_shard(&c, 0, 1, NULL, &l, &p, err, sizeof err) == 0);
  TH_CHECK(!memcmp(&c, &l, sizeof c));
  TH_CHECK_EQ_INT(p.vocab0, 0);
  TH_CHECK_EQ_INT(p.vocab_n, 262144);
}

TH_TEST(shard_one_kv_head_is_replicated) {
  struct md_config c, l;
  struct wk_shard_plan p;
  char err[256];
  make(&c, 4, 1, 2048, 262144); /* gemma-3-270m's heads */
  for (int w = 2; w <= 4; w *= 2)
    for (int r = 0; r < w; r++) {
      TH_REQUIRE(wk_config_shard(&c, r, w, NULL, &l, &p, err, sizeof err) == 0);
      TH_CHECK_EQ_INT(l.n_heads, 4 / w);
      TH_CHECK_EQ_INT(p.q_head0, r * (4 / w));
      TH_CHECK_EQ_INT(p.vocab_n, 262144 / w);
      TH_CHECK_EQ_INT(p.vocab0, r * (262144 / w));
      for (int i = 0; i < c.n_layers; i++) {
        TH_CHECK_EQ_INT(l.layers[i].n_kv_heads, 1);
        TH_CHECK_EQ_INT(p.kv_head0[i], 0);
        TH_CHECK_EQ_INT(l.layers[i].ffn_dim, 2048 / w);
        TH_CHECK_EQ_INT(p.ffn0[i], r * (2048 / w));
        TH_CHECK_EQ_INT(l.layers[i].head_dim, c.layers[i].head_dim);
      }
    }
  expect_refused(4, 1, 2048, 262144, 0, 8, "num_attention_heads = 4");
}

TH_TEST(shard_kv_heads_split_or_shared_by_groups) {
  struct md_config c, l;
  struct wk_shard_plan p;
  char err[256];
  make(&c, 8, 4, 4096, 262144);
  /* size 2: two KV heads each */
  for (int r = 0; r < 2; r++) {
    TH_REQUIRE(wk_config_shard(&c, r, 2, NULL, &l, &p, err, sizeof err) == 0);
    TH_CHECK_EQ_INT(l.layers[0].n_kv_heads, 2);
    TH_CHECK_EQ_INT(p.kv_head0[0], 2 * r);
  }
  /* size 8: one query head each; query head q reads KV head q / 2 */
  for (int r = 0; r < 8; r++) {
    TH_REQUIRE(wk_config_shard(&c, r, 8, NULL, &l, &p, err, sizeof err) == 0);
    TH_CHECK_EQ_INT(l.n_heads, 1);
    TH_CHECK_EQ_INT(l.layers[3].n_kv_heads, 1);
    TH_CHECK_EQ_INT(p.kv_head0[3], r / 2);
  }
  expect_refused(6, 3, 4096, 262144, 1, 2, "3 key/value heads");
}

/* The MLP's cut under a unit (the block of a down projection's format, per
 * layer): an even share where it is whole units, else whole units, one more on
 * the first ranks; each layer's cuts tile its width in rank order. */
TH_TEST(shard_mlp_cuts_fall_on_whole_blocks) {
  static const struct {
    int ffn, unit, world, n0; /* n0: rank 0's width */
  } cases[] = {
      {6912, 256, 2, 3584}, /* gemma-3-1b's 27 blocks of Q4_K: 14 and 13 */
      {6912, 256, 4, 1792}, /* 7, 7, 7, 6 */
      {6912, 32, 2, 3456},  /* Q8_0: the even cut is whole blocks */
      {768, 256, 2, 512},   {2048, 256, 4, 512}, {10240, 256, 8, 1280},
  };
  struct md_config c, l;
  struct wk_shard_plan p;
  char err[256];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int F = cases[k].ffn, w = cases[k].world, next[MD_MAX_LAYERS] = {0};
    struct wk_shard_units units = {.moe = 1};
    make(&c, 8, 8, F, 262144);
    /* odd layers' down projections in a format of single elements (bf16) */
    for (int i = 0; i < c.n_layers; i++)
      units.ffn[i] = i % 2 ? 1 : cases[k].unit;
    int lo = F, hi = 0;
    for (int r = 0; r < w; r++) {
      TH_REQUIRE(wk_config_shard(&c, r, w, &units, &l, &p, err, sizeof err) == 0);
      for (int i = 0; i < c.n_layers; i++) {
        int n = l.layers[i].ffn_dim;
        TH_CHECK_EQ_INT(p.ffn0[i], next[i]);
        TH_CHECK_EQ_INT(n % units.ffn[i], 0);
        if (units.ffn[i] == 1) TH_CHECK_EQ_INT(n, F / w);
        /* the width the cut follows, for the ranks' checksum: 1 for even shares */
        int even = F % w == 0 && F / w % units.ffn[i] == 0;
        TH_CHECK_EQ_INT(p.units.ffn[i], even ? 1 : units.ffn[i]);
        next[i] += n;
      }
      if (r == 0) TH_CHECK_EQ_INT(l.layers[0].ffn_dim, cases[k].n0);
      lo = l.layers[0].ffn_dim < lo ? l.layers[0].ffn_dim : lo;
      hi = l.layers[0].ffn_dim > hi ? l.layers[0].ffn_dim : hi;
    }
    for (int i = 0; i < c.n_layers; i++)
      TH_CHECK_EQ_INT(next[i], F);
    TH_CHECK(hi - lo <= cases[k].unit);
  }
  /* two blocks of 256 over four ranks */
  make(&c, 8, 8, 512, 262144);
  struct wk_shard_units units = {.moe = 1};
  for (int i = 0; i < c.n_layers; i++)
    units.ffn[i] = 256;
  TH_CHECK_EQ_INT(wk_config_shard(&c, 0, 4, &units, &l, &p, err, sizeof err), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "intermediate_size = 512") && strstr(err, "whole blocks of 256"));
}

/* The experts likewise: Gemma 4 MoE experts 96 wide in blocks of 32 over two
 * ranks hold 64 and 32 columns (48 each where any cut will do); over four ranks
 * three blocks cannot be cut. */
TH_TEST(shard_expert_cuts_fall_on_whole_blocks) {
  struct tl_tiny_spec s;
  struct tl_tiny_opts o = {
      .arch = "gemma4", .preset = "tiny-dense", .vocab = 512, .moe = 1, .moe_ffn = 96};
  struct md_config c, l;
  struct wk_shard_plan p;
  char err[256] = "";
  TH_REQUIRE(tl_tiny_spec_build(&s, &o, err, sizeof err) == 0);
  int rc = md_config_parse(s.config_json, strlen(s.config_json), &c, err, sizeof err);
  tl_tiny_spec_free(&s);
  TH_REQUIRE(rc == 0 && c.moe && c.moe_ffn == 96);
  struct wk_shard_units u = {.moe = 32};
  for (int i = 0; i < c.n_layers; i++)
    u.ffn[i] = 1;
  for (int r = 0; r < 2; r++) {
    TH_REQUIRE(wk_config_shard(&c, r, 2, &u, &l, &p, err, sizeof err) == 0);
    TH_CHECK_EQ_INT(l.moe_ffn, r ? 32 : 64);
    TH_CHECK_EQ_INT(p.moe0, r ? 64 : 0);
    TH_CHECK_EQ_INT(l.layers[0].ffn_dim, c.layers[0].ffn_dim / 2);
    TH_REQUIRE(wk_config_shard(&c, r, 2, NULL, &l, &p, err, sizeof err) == 0);
    TH_CHECK_EQ_INT(l.moe_ffn, 48);
    TH_CHECK_EQ_INT(p.moe0, 48 * r);
  }
  TH_CHECK_EQ_INT(wk_config_shard(&c, 0, 4, &u, &l, &p, err, sizeof err), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "moe_intermediate_size = 96") && strstr(err, "whole blocks of 32"));
}

TH_TEST(shard_refusals_name_the_dimension) {
  expect_refused(4, 1, 2048, 262145, 0, 2, "vocab_size = 262145");
  expect_refused(4, 1, 2050, 262144, 0, 4, "intermediate_size = 2050");
  /* ranks and sizes out of range */
  expect_refused(4, 1, 2048, 262144, 2, 2, NULL);
  expect_refused(4, 1, 2048, 262144, -1, 2, NULL);
  expect_refused(4, 1, 2048, 262144, 0, 0, NULL);
  expect_refused(4, 1, 2048, 262144, 0, WK_MAX_TP + 1, NULL);
}
