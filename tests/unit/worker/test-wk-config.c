/* test-wk-config.c — config.json parsing (both field generations, nested
 * text_config, the assistant), the per-layer plan and the KV plan from a
 * config alone. */
#include <stdio.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "tests/harness/th.h"
#include "worker/wk-kv.h"

static int parse(const char *json, struct md_config *c, char *err) {
  return md_config_parse(json, strlen(json), c, err, 256);
}

/* Parses json into c; a refusal stops the test with the parser's reason. */
static void parse_ok(const char *json, struct md_config *c) {
  char err[256] = "";
  if (parse(json, c, err) != 0) {
    th_fail(__FILE__, __LINE__, "%s", err);
    th_stop();
  }
}

/* The opening fields of a text config (model type, vocabulary, widths, layers, heads);
 * the rest of the object follows in the same string. */
#define TEXT(type, vocab, hidden, inter, layers, heads)                                            \
  "{\"model_type\":\"" type "\",\"vocab_size\":" #vocab ",\"hidden_size\":" #hidden                \
  ",\"intermediate_size\":" #inter ",\"num_hidden_layers\":" #layers                               \
  ",\"num_attention_heads\":" #heads

/* gemma-3-1b's config.json (older field generation). */
static const char *gemma3_1b =
    "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\","
    "\"vocab_size\":262144,\"hidden_size\":1152,\"intermediate_size\":6912,"
    "\"num_hidden_layers\":26,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
    "\"head_dim\":256,\"query_pre_attn_scalar\":256,\"sliding_window\":512,"
    "\"sliding_window_pattern\":6,\"rope_theta\":1000000.0,\"rope_local_base_freq\":10000.0,"
    "\"rope_scaling\":null,\"max_position_embeddings\":32768,\"rms_norm_eps\":1e-06,"
    "\"final_logit_softcapping\":null,\"attn_logit_softcapping\":null,"
    "\"hidden_activation\":\"gelu_pytorch_tanh\",\"eos_token_id\":[1,106]}";

TH_TEST(config_gemma3_older_fields) {
  struct md_config c;
  parse_ok(gemma3_1b, &c);
  TH_CHECK_EQ_INT(c.arch, MD_ARCH_GEMMA3);
  TH_CHECK_EQ_INT(c.n_layers, 26);
  for (int i = 0; i < 26; i++)
    TH_CHECK_EQ_INT(c.layers[i].kind, (i + 1) % 6 == 0 ? MD_LAYER_FULL : MD_LAYER_SLIDING);
  TH_CHECK_NEAR(c.rope[MD_LAYER_FULL].theta, 1e6, 1e-6);
  TH_CHECK_NEAR(c.rope[MD_LAYER_SLIDING].theta, 1e4, 1e-6);
  TH_CHECK_EQ_INT(c.rope[MD_LAYER_FULL].rot_pairs, 128);
  TH_CHECK_NEAR(c.attn_scale, 1.0 / 16.0, 1e-12);
  TH_CHECK_EQ_INT(c.n_eos, 2);
  TH_CHECK_EQ_INT(c.eos_ids[1], 106);
  TH_CHECK_EQ_INT(c.final_softcap == 0, 1);
  TH_CHECK_EQ_INT(c.layers[5].kv_shared, 0);
  TH_CHECK_EQ_INT(c.layers[5].head_dim, 256);
}

TH_TEST(config_gemma3_rope_scaling_and_nested) {
  const char *j = "{\"model_type\":\"gemma3\",\"text_config\":" TEXT(
      "gemma3_text", 1000, 64, 128, 6,
      4) ",\"num_key_value_heads\":2,\"head_dim\":16,"
         "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":8.0},\"rope_theta\":1000000}}";
  struct md_config c;
  parse_ok(j, &c);
  TH_CHECK_NEAR(c.rope[MD_LAYER_FULL].factor, 8.0, 1e-12);
  TH_CHECK_NEAR(c.rope[MD_LAYER_SLIDING].factor, 1.0, 1e-12);
  TH_CHECK_NEAR(c.attn_scale, 0.25, 1e-12); /* query_pre_attn_scalar defaults to head_dim */
}

/* A Gemma 4 E2B-shaped text config, newer field generation. */
static void e2b_json(char *buf, size_t n, int nested) {
  char types[2048] = "";
  for (int i = 0; i < 35; i++) {
    strcat(types, i ? "," : "");
    strcat(types, (i + 1) % 5 == 0 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  char text[4096];
  snprintf(
      text, sizeof(text),
      TEXT("gemma4_text", 262144, 1536, 6144, 35,
           8) ",\"num_key_value_heads\":1,\"head_dim\":256,\"global_head_dim\":512,"
              "\"sliding_window\":512,\"num_kv_shared_layers\":20,\"use_double_wide_mlp\":true,"
              "\"hidden_size_per_layer_input\":256,\"vocab_size_per_layer_input\":262144,"
              "\"final_logit_softcapping\":30.0,\"layer_types\":[%s],"
              "\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\","
              "\"rope_theta\":10000.0},\"full_attention\":{\"rope_type\":\"proportional\","
              "\"partial_rotary_factor\":0.25,\"rope_theta\":1000000.0}}}",
      types);
  if (nested)
    snprintf(buf, n, "{\"model_type\":\"gemma4\",\"text_config\":%s,\"vision_config\":{}}", text);
  else
    snprintf(buf, n, "%s", text);
}

TH_TEST(config_gemma4_e2b_plan) {
  static char j[8192];
  for (int nested = 0; nested < 2; nested++) {
    e2b_json(j, sizeof(j), nested);
    struct md_config c;
    parse_ok(j, &c);
    TH_CHECK_EQ_INT(c.arch, MD_ARCH_GEMMA4);
    TH_CHECK_NEAR(c.attn_scale, 1.0, 0);
    TH_CHECK_NEAR(c.final_softcap, 30.0, 0);
    TH_CHECK_EQ_INT(c.rope[MD_LAYER_FULL].rot_pairs, 64);
    TH_CHECK_EQ_INT(c.rope[MD_LAYER_SLIDING].rot_pairs, 128);
    for (int i = 0; i < 35; i++) {
      int full = (i + 1) % 5 == 0;
      TH_CHECK_EQ_INT(c.layers[i].head_dim, full ? 512 : 256);
      TH_CHECK_EQ_INT(c.layers[i].kv_shared, i >= 15);
      TH_CHECK_EQ_INT(c.layers[i].ffn_dim, i >= 15 ? 12288 : 6144);
      if (i >= 15)
        TH_CHECK_EQ_INT(c.layers[i].kv_source, full ? 14 : 13);
      else
        TH_CHECK_EQ_INT(c.layers[i].kv_source, i);
    }
    TH_CHECK_EQ_INT(md_config_last_storing_layer(&c, MD_LAYER_SLIDING), 13);
    TH_CHECK_EQ_INT(md_config_last_storing_layer(&c, MD_LAYER_FULL), 14);
  }
}

/* Only 15 of E2B's 35 layers store KV: 12 sliding (1 x 256) and 3 full
 * (1 x 512) layers. */
TH_TEST(kv_spec_e2b_bytes_per_token) {
  static char j[8192];
  e2b_json(j, sizeof(j), 0);
  struct md_config c;
  parse_ok(j, &c);
  struct wk_kv_spec kv;
  TH_REQUIRE(wk_kv_spec_build(&c, KN_DTYPE_BF16, 16, &kv) == 0);
  TH_REQUIRE(kv.n_groups == 2);
  const struct wk_kv_group *sl = &kv.groups[0], *fu = &kv.groups[1];
  TH_CHECK_EQ_INT(sl->kind, MD_LAYER_SLIDING);
  TH_CHECK_EQ_INT(sl->n_layers, 12);
  TH_CHECK_EQ_INT(fu->n_layers, 3);
  TH_CHECK_EQ_INT(sl->bytes_per_token, 12 * 2 * 256 * 2);
  TH_CHECK_EQ_INT(fu->bytes_per_token, 3 * 2 * 512 * 2);
  TH_CHECK_EQ_INT(wk_kv_bytes_per_token(&kv), 18432);
  /* every layer storing would be 28 * 1024 + 7 * 2048 bytes */
  TH_CHECK(wk_kv_bytes_per_token(&kv) < 28 * 1024 + 7 * 2048);
  TH_CHECK_EQ_INT(sl->block_tokens, 16);
  TH_CHECK_EQ_INT(kv.page_bytes, 16 * 12288);
  TH_CHECK_EQ_INT(fu->block_tokens, 32);
  TH_CHECK_EQ_INT(sl->window, 512);
  TH_CHECK_EQ_INT(fu->window, 0);
  /* shared layers read their source's group and offsets */
  for (int i = 15; i < 35; i++) {
    int src = c.layers[i].kv_source;
    TH_CHECK_EQ_INT(kv.layer_group[i], kv.layer_group[src]);
    TH_CHECK_EQ_INT(kv.layer_k_off[i], kv.layer_k_off[src]);
    TH_CHECK_EQ_INT(kv.layer_v_off[i], kv.layer_v_off[src]);
  }
  /* storing layers of a group never overlap within a page */
  for (int g = 0; g < 2; g++) {
    const struct wk_kv_group *G = &kv.groups[g];
    size_t half = (size_t)G->block_tokens * G->n_kv_heads * G->head_dim * 2;
    for (int a = 0; a < G->n_layers; a++) {
      TH_CHECK_EQ_INT(kv.layer_v_off[G->layers[a]], kv.layer_k_off[G->layers[a]] + half);
      if (a) TH_CHECK_EQ_INT(kv.layer_k_off[G->layers[a]], kv.layer_v_off[G->layers[a - 1]] + half);
    }
    TH_CHECK(kv.layer_v_off[G->layers[G->n_layers - 1]] + half <= kv.page_bytes);
  }
  TH_CHECK_EQ_INT(wk_kv_blocks_for(&kv, 1, 33), 2);
}

TH_TEST(config_assistant_fields) {
  const char *j =
      "{\"model_type\":\"gemma4_assistant\",\"backbone_hidden_size\":1536,"
      "\"use_ordered_embeddings\":true,\"num_centroids\":2048,\"centroid_intermediate_top_k\":32,"
      "\"text_config\":" TEXT(
          "gemma4_text", 262144, 256, 2048, 4,
          4) ",\"num_key_value_heads\":1,\"head_dim\":256,\"global_head_dim\":512,"
             "\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"sliding_attention\","
             "\"full_attention\"],\"hidden_size_per_layer_input\":0,\"vocab_size_per_layer_input\":"
             "0}}";
  struct md_config c;
  parse_ok(j, &c);
  TH_CHECK_EQ_INT(c.arch, MD_ARCH_GEMMA4_ASSISTANT);
  TH_CHECK_EQ_INT(c.backbone_hidden, 1536);
  TH_CHECK_EQ_INT(c.use_ordered_embeddings, 1);
  TH_CHECK_EQ_INT(c.num_centroids, 2048);
  TH_CHECK_EQ_INT(c.centroid_top_k, 32);
  TH_CHECK_EQ_INT(c.n_kv_shared, 4);
  for (int i = 0; i < 4; i++) {
    TH_CHECK_EQ_INT(c.layers[i].kv_shared, 1);
    TH_CHECK_EQ_INT(c.layers[i].kv_source, -1);
  }
  TH_CHECK_EQ_INT(c.layers[3].head_dim, 512);
  struct wk_kv_spec kv;
  TH_CHECK_EQ_INT(wk_kv_spec_build(&c, KN_DTYPE_BF16, 16, &kv), 0);
  TH_CHECK_EQ_INT(kv.n_groups, 0);
}

TH_TEST(config_errors_name_the_field) {
  struct md_config c;
  char err[256];
  struct {
    const char *json;
    int code;
    const char *needle;
  } cases[] = {
      {"{\"model_type\":\"llama\"}", CM_ERR_UNSUPPORTED, "llama"},
      {"{\"model_type\":\"gemma3_text\"}", CM_ERR_PARSE, "vocab_size"},
      {"{\"model_type\":", CM_ERR_PARSE, "line"},
      {"[1,2]", CM_ERR_PARSE, "object"},
      {"{\"hidden_size\":3}", CM_ERR_PARSE, "model_type"},
      {"{\"model_type\":\"gemma4\"}", CM_ERR_PARSE, "text_config"},
      {TEXT("gemma3_text", 10, -4, 8, 1, 1) "}", CM_ERR_RANGE, "hidden_size"},
      {TEXT("gemma4_text", 10, 8, 8, 2, 1) ",\"layer_types\":[\"full_attention\"]}", CM_ERR_SHAPE,
       "layer_types"},
      {TEXT("gemma4_text", 10, 8, 8, 1, 1) ",\"rope_parameters\":{\"full_attention\":{"
                                           "\"rope_type\":\"yarn\"}}}",
       CM_ERR_UNSUPPORTED, "yarn"},
      {TEXT("gemma3_text", 10, 8, 8, 1, 3) ",\"num_key_value_heads\":2}", CM_ERR_INVAL, "multiple"},
      {TEXT("gemma3_text", 10, 8, 8, 1, 1) ",\"hidden_activation\":\"silu\"}", CM_ERR_UNSUPPORTED,
       "silu"},
      {TEXT("gemma4_text", 10, 8, 8, 2, 1) ",\"num_kv_shared_layers\":2}", CM_ERR_INVAL,
       "KV-shared"},
      /* head_dim derived as hidden / heads = 0 (found by fuzzing) */
      {TEXT("gemma4_text", 10, 1, 8, 2, 2) "}", CM_ERR_RANGE, "head_dim"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    err[0] = 0;
    int rc = parse(cases[i].json, &c, err);
    if (rc != cases[i].code || !strstr(err, cases[i].needle))
      th_fail(__FILE__, __LINE__, "case %zu: rc %d (want %d), err \"%s\"", i, rc, cases[i].code,
              err);
  }
}

TH_TEST(config_generation_eos) {
  struct md_config c;
  parse_ok(gemma3_1b, &c);
  char err[256] = "";
  const char *g = "{\"eos_token_id\": [1, 106, 50]}";
  TH_CHECK_EQ_INT(md_config_parse_generation(g, strlen(g), &c, err, sizeof(err)), 0);
  TH_CHECK_EQ_INT(c.n_eos, 3);
  TH_CHECK_EQ_INT(c.eos_ids[2], 50);
  const char *bad = "{\"eos_token_id\": [1, \"x\"]}";
  TH_CHECK_EQ_INT(md_config_parse_generation(bad, strlen(bad), &c, err, sizeof(err)), CM_ERR_PARSE);
  const char *range = "{\"eos_token_id\": 999999999}";
  TH_CHECK_EQ_INT(md_config_parse_generation(range, strlen(range), &c, err, sizeof(err)),
                  CM_ERR_RANGE);
}

/* Newer Gemma 3 checkpoints keep the thetas at the top level and
 * rope_parameters entries without rope_theta. */
TH_TEST(config_gemma3_rope_parameters_without_theta) {
  const char *j =
      TEXT("gemma3_text", 1000, 64, 128, 6,
           4) ",\"head_dim\":16,\"rope_theta\":1000000,\"rope_local_base_freq\":10000,"
              "\"rope_parameters\":{\"full_attention\":{\"factor\":8.0,\"rope_type\":\"linear\"},"
              "\"sliding_attention\":{\"rope_type\":\"default\"}}}";
  struct md_config c;
  parse_ok(j, &c);
  TH_CHECK_NEAR(c.rope[MD_LAYER_FULL].theta, 1e6, 0);
  TH_CHECK_NEAR(c.rope[MD_LAYER_FULL].factor, 8.0, 0);
  TH_CHECK_NEAR(c.rope[MD_LAYER_SLIDING].theta, 1e4, 0);
  TH_CHECK_NEAR(c.rope[MD_LAYER_SLIDING].factor, 1.0, 0);
  TH_CHECK_EQ_INT(c.rope[MD_LAYER_FULL].rot_pairs, 8);
}

/* Newer Gemma 4 configs: per-layer head dims and KV heads under
 * "per_layer_config" (by layer index or by layer type). */
TH_TEST(config_gemma4_per_layer_config) {
  const char *j =
      TEXT("gemma4_text", 100, 64, 128, 4,
           4) ",\"num_key_value_heads\":2,\"head_dim\":32,\"attention_k_eq_v\":true,"
              "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
              "\"full_attention\"],\"per_layer_config\":{\"1\":{\"head_dim\":64,"
              "\"num_key_value_heads\":1},\"3\":{\"head_dim\":64,\"num_key_value_heads\":1}}}";
  struct md_config c;
  parse_ok(j, &c);
  char err[256] = "";
  TH_CHECK_EQ_INT(c.global_head_dim, 64);
  TH_CHECK_EQ_INT(c.layers[1].head_dim, 64);
  TH_CHECK_EQ_INT(c.layers[1].n_kv_heads, 1);
  TH_CHECK_EQ_INT(c.layers[0].head_dim, 32);
  TH_CHECK_EQ_INT(c.layers[0].n_kv_heads, 2);
  TH_CHECK_EQ_INT(c.rope[MD_LAYER_FULL].rot_pairs, 8);
  /* two layers, sliding then full, of head_dim 32 */
#define TWO       TEXT("gemma4_text", 100, 64, 128, 2, 4)
#define TWO_TYPED TWO ",\"head_dim\":32,\"layer_types\":[\"sliding_attention\",\"full_attention\"]"
  const char *by_type = TWO_TYPED ",\"per_layer_config\":{\"full_attention\":{\"head_dim\":128}}}";
  parse_ok(by_type, &c);
  TH_CHECK_EQ_INT(c.layers[1].head_dim, 128);
  const char *mixed = TWO_TYPED ",\"per_layer_config\":{\"0\":{\"head_dim\":16}}}";
  TH_CHECK_EQ_INT(parse(mixed, &c, err), CM_ERR_UNSUPPORTED);
  const char *bad = TWO ",\"per_layer_config\":{\"7\":{}}}";
  TH_CHECK_EQ_INT(parse(bad, &c, err), CM_ERR_PARSE);
#undef TWO_TYPED
#undef TWO
}
