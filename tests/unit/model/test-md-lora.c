/* test-md-lora.c — PEFT LoRA adapters (model/md-lora.h) against a small
 * hand-made config: a good adapter's settings and weights read back exactly,
 * and every refusal naming its key, tensor or file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "kernels/kn-dtype.h" /* header only: the conversions every kernel uses, as the oracle */
#include "model/md-lora.h"
#include "tests/harness/th.h"
#include "tests/unit/model/md-test-util.h"

#define ROOT "base_model.model."

/* Four layers whose module widths all differ, hidden 10 and 2 query heads:
 *   0, 1  sliding, head_dim 3, 1 KV head, ffn 7: q 10->6, k v 10->3, o 6->10,
 *         gate up 10->7, down 7->10
 *   2     full, head_dim 4, k_eq_v with 2 KV heads: q 10->8, k 10->8, no v, o 8->10
 *   3     sliding, KV-shared (reads layer 1), double-wide ffn 14 */
static void tiny_cfg(struct md_config *c) {
  memset(c, 0, sizeof(*c));
  c->arch = MD_ARCH_GEMMA4;
  c->hidden = 10;
  c->ffn = 7;
  c->n_layers = 4;
  c->n_heads = 2;
  c->n_kv_heads = 1;
  c->head_dim = 3;
  c->global_head_dim = 4;
  c->n_global_kv_heads = 2;
  c->k_eq_v = 1;
  c->n_kv_shared = 1;
  for (int i = 0; i < 4; i++) {
    struct md_layer_cfg *l = &c->layers[i];
    l->kind = i == 2 ? MD_LAYER_FULL : MD_LAYER_SLIDING;
    l->head_dim = i == 2 ? 4 : 3;
    l->n_kv_heads = i == 2 ? 2 : 1;
    l->k_eq_v = i == 2;
    l->kv_shared = i == 3;
    l->kv_source = i == 3 ? 1 : i;
    l->ffn_dim = i == 3 ? 14 : 7;
  }
}

/* ---- adapters on disk ------------------------------------------------------- */

struct tt {
  char name[200];
  enum md_st_dtype dt;
  int64_t rows, cols;
};

/* The stored bits of element k of tensor j: distinct, finite, normal values of
 * both signs. */
static uint32_t raw_bits(int j, int64_t k, enum md_st_dtype dt) {
  uint32_t s = (uint32_t)(j * 97 + k * 13);
  switch (dt) {
  case MD_ST_F32: return 0x3e000000u + s * 0x1235u + (k % 3 == 0 ? 0x80000000u : 0);
  case MD_ST_F16: return 0x3000u + s % 0x3000u + (k % 2 ? 0x8000u : 0);
  case MD_ST_BF16: return 0x3c00u + s % 0x0800u + (k % 3 == 1 ? 0x8000u : 0);
  default: return (uint32_t)k;
  }
}

/* What md_lora_read_f32 must give for it (mul 1). */
static float expect(int j, int64_t k, enum md_st_dtype dt) {
  uint32_t b = raw_bits(j, k, dt);
  switch (dt) {
  case MD_ST_F16: return kn_f16_to_f32((uint16_t)b);
  case MD_ST_BF16: return kn_bf16_to_f32((uint16_t)b);
  default: return kn_f32_from_bits(b);
  }
}

/* A fresh directory under $TMPDIR (or /tmp); path in buf. */
static int tmpdir(char *buf, size_t n) {
  const char *t = getenv("TMPDIR");
  snprintf(buf, n, "%s/lmserve-lora-XXXXXX", t && *t ? t : "/tmp");
  return mkdtemp(buf) ? 0 : -1;
}

static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors",
                                    "adapter_model.bin"};

static void rmdir_all(const char *dir) {
  char p[4200];
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
    snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* Writes adapter_config.json (none for config NULL) and adapter_model.safetensors
 * with the n tensors t (none for n < 0), their data from raw_bits. */
static void write_adapter(const char *dir, const char *config, const struct tt *t, int n) {
  char p[4200];
  for (size_t i = 0; i < 2; i++) {
    snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
    unlink(p);
  }
  if (config) mdt_write_text(dir, "adapter_config.json", config);
  if (n < 0) return;
  struct md_st_entry e[64];
  TH_REQUIRE(n <= 64);
  for (int j = 0; j < n; j++)
    e[j] = (struct md_st_entry){
        .name = t[j].name, .dtype = t[j].dt, .ndim = 2, .shape = {t[j].rows, t[j].cols}};
  snprintf(p, sizeof(p), "%s/adapter_model.safetensors", dir);
  FILE *f = fopen(p, "wb");
  TH_REQUIRE(f);
  TH_REQUIRE(md_st_write_header(f, e, n) == 0);
  for (int j = 0; j < n; j++) {
    size_t es = md_st_dtype_size(t[j].dt);
    for (int64_t k = 0; k < t[j].rows * t[j].cols; k++) {
      uint32_t b = raw_bits(j, k, t[j].dt);
      unsigned char le[4] = {(unsigned char)b, (unsigned char)(b >> 8), (unsigned char)(b >> 16),
                             (unsigned char)(b >> 24)};
      fwrite(le, 1, es, f);
    }
  }
  fclose(f);
}

/* A module's A and B (rank r) as t[0], t[1]: prefix is PREFIX, widths from the
 * tiny config. */
static void mod_pair(struct tt *t, const char *prefix, int layer, enum md_lora_mod m, int r,
                     enum md_st_dtype dt) {
  struct md_config c;
  tiny_cfg(&c);
  int in = 0, out = 0;
  md_lora_dims(&c, layer, m, &in, &out);
  const char *parent = m <= MD_LORA_O ? "self_attn" : "mlp";
  snprintf(t[0].name, sizeof(t[0].name), ROOT "%slayers.%d.%s.%s.lora_A.weight", prefix, layer,
           parent, md_lora_mod_name(m));
  snprintf(t[1].name, sizeof(t[1].name), ROOT "%slayers.%d.%s.%s.lora_B.weight", prefix, layer,
           parent, md_lora_mod_name(m));
  t[0].dt = t[1].dt = dt;
  t[0].rows = r, t[0].cols = in;
  t[1].rows = out, t[1].cols = r;
}

/* md_lora_open of the adapter written from (config, t, n) must fail with
 * `want` and a message holding s1 and s2 (when not NULL). */
static void refused(int line, const char *dir, const char *config, const struct tt *t, int n,
                    int want, const char *s1, const char *s2) {
  struct md_config c;
  tiny_cfg(&c);
  write_adapter(dir, config, t, n);
  struct md_lora *l = (struct md_lora *)1;
  char err[512] = "";
  int rc = md_lora_open(dir, &c, &l, err, sizeof(err));
  if (rc != want || l != NULL || (s1 && !strstr(err, s1)) || (s2 && !strstr(err, s2)))
    th_fail(__FILE__, line, "rc %d (want %d), err \"%s\" (want \"%s\", \"%s\")", rc, want, err,
            s1 ? s1 : "", s2 ? s2 : "");
  if (rc == 0) md_lora_close(l);
}
#define REFUSED(config, t, n, want, s1, s2) refused(__LINE__, dir, config, t, n, want, s1, s2)

/* ---- tests -------------------------------------------------------------------- */

TH_TEST(lora_dims) {
  struct md_config c;
  tiny_cfg(&c);
  static const int want[4][MD_LORA_N_MODS][2] = {
      {{10, 6}, {10, 3}, {10, 3}, {6, 10}, {10, 7}, {10, 7}, {7, 10}},
      {{10, 6}, {10, 3}, {10, 3}, {6, 10}, {10, 7}, {10, 7}, {7, 10}},
      {{10, 8}, {10, 8}, {0, 0}, {8, 10}, {10, 7}, {10, 7}, {7, 10}},
      {{10, 6}, {10, 3}, {10, 3}, {6, 10}, {10, 14}, {10, 14}, {14, 10}},
  };
  for (int i = 0; i < 4; i++)
    for (int m = 0; m < MD_LORA_N_MODS; m++) {
      int in = -1, out = -1;
      int rc = md_lora_dims(&c, i, (enum md_lora_mod)m, &in, &out);
      if (i == 2 && m == MD_LORA_V) {
        TH_CHECK_EQ_INT(rc, CM_ERR_INVAL);
        continue;
      }
      if (rc || in != want[i][m][0] || out != want[i][m][1])
        th_fail(__FILE__, __LINE__, "layer %d %s: rc %d, %d -> %d (want %d -> %d)", i,
                md_lora_mod_name((enum md_lora_mod)m), rc, in, out, want[i][m][0], want[i][m][1]);
    }
  int in, out;
  TH_CHECK_EQ_INT(md_lora_dims(&c, 4, MD_LORA_Q, &in, &out), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_dims(&c, -1, MD_LORA_Q, &in, &out), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_dims(&c, 0, MD_LORA_N_MODS, &in, &out), CM_ERR_RANGE);
  TH_CHECK_EQ_STR(md_lora_mod_name(MD_LORA_Q), "q_proj");
  TH_CHECK_EQ_STR(md_lora_mod_name(MD_LORA_V), "v_proj");
  TH_CHECK_EQ_STR(md_lora_mod_name(MD_LORA_GATE), "gate_proj");
  TH_CHECK_EQ_STR(md_lora_mod_name(MD_LORA_DOWN), "down_proj");
}

/* Every module of layer 0 ("model."), q and o of layer 1
 * ("model.language_model."), all but v of the k_eq_v layer 2
 * ("language_model.model."), k, v and down of the KV-shared layer 3
 * ("language_model."); the three dtypes in turn. Rank 4. */
static int good_tensors(struct tt *t) {
  static const struct {
    const char *prefix;
    int layer;
    enum md_lora_mod m;
  } mods[] = {
      {"model.", 0, MD_LORA_Q},
      {"model.", 0, MD_LORA_K},
      {"model.", 0, MD_LORA_V},
      {"model.", 0, MD_LORA_O},
      {"model.", 0, MD_LORA_GATE},
      {"model.", 0, MD_LORA_UP},
      {"model.", 0, MD_LORA_DOWN},
      {"model.language_model.", 1, MD_LORA_Q},
      {"model.language_model.", 1, MD_LORA_O},
      {"language_model.model.", 2, MD_LORA_Q},
      {"language_model.model.", 2, MD_LORA_K},
      {"language_model.model.", 2, MD_LORA_O},
      {"language_model.model.", 2, MD_LORA_GATE},
      {"language_model.model.", 2, MD_LORA_UP},
      {"language_model.model.", 2, MD_LORA_DOWN},
      {"language_model.", 3, MD_LORA_K},
      {"language_model.", 3, MD_LORA_V},
      {"language_model.", 3, MD_LORA_DOWN},
  };
  static const enum md_st_dtype dts[3] = {MD_ST_F32, MD_ST_F16, MD_ST_BF16};
  int n = 0;
  for (size_t i = 0; i < sizeof(mods) / sizeof(mods[0]); i++, n += 2)
    mod_pair(t + n, mods[i].prefix, mods[i].layer, mods[i].m, 4, dts[i % 3]);
  return n;
}

TH_TEST(lora_good_adapter) {
  char dir[256];
  TH_REQUIRE(tmpdir(dir, sizeof(dir)) == 0);
  struct tt t[64];
  int n = good_tensors(t);
  write_adapter(dir,
                "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 16, \"use_rslora\": false,"
                " \"base_model_name_or_path\": \"google/gemma-4-E2B-it\", \"task_type\": "
                "\"CAUSAL_LM\", \"bias\": \"none\", \"target_modules\": [\"q_proj\", \"o_proj\"],"
                " \"modules_to_save\": null, \"rank_pattern\": {}, \"alpha_pattern\": {},"
                " \"use_dora\": false, \"fan_in_fan_out\": false, \"layer_replication\": null,"
                " \"lora_bias\": false, \"use_qalora\": false, \"target_parameters\": null,"
                " \"lora_dropout\": 0.05, \"a_setting_of_tomorrow\": {\"x\": [1, 2]}}",
                t, n);
  struct md_config c;
  tiny_cfg(&c);
  struct md_lora *l = NULL;
  char err[512] = "";
  int rc = md_lora_open(dir, &c, &l, err, sizeof(err));
  if (rc) th_fail(__FILE__, __LINE__, "open: %d %s", rc, err);
  TH_REQUIRE(rc == 0 && l);
  TH_CHECK_EQ_INT(l->rank, 4);
  TH_CHECK(l->alpha == 16.0);
  TH_CHECK_EQ_INT(l->rslora, 0);
  TH_CHECK(l->scale == 4.0);
  TH_CHECK_EQ_INT(l->n_layers, 4);
  TH_CHECK_EQ_INT(l->n_adapted, n / 2);
  TH_CHECK_EQ_STR(l->base_model, "google/gemma-4-E2B-it");
  TH_REQUIRE(l->st && l->mods);
  /* every tensor where its name puts it, every value exact */
  int seen = 0;
  for (int j = 0; j < n; j++) {
    const struct md_tensor *found = NULL;
    for (int i = 0; i < 4 && !found; i++)
      for (int m = 0; m < MD_LORA_N_MODS && !found; m++) {
        const struct md_lora_mod_w *w = &l->mods[i][m];
        if (w->a && !strcmp(w->a->name, t[j].name)) found = w->a;
        if (w->b && !strcmp(w->b->name, t[j].name)) found = w->b;
      }
    if (!found) {
      th_fail(__FILE__, __LINE__, "%s is in no module", t[j].name);
      continue;
    }
    seen++;
    TH_CHECK_EQ_INT(found->dtype, t[j].dt);
    float got[200];
    TH_REQUIRE(t[j].rows * t[j].cols <= 200);
    TH_CHECK_EQ_INT(md_lora_read_f32(found, 0, (int)t[j].rows, 0, (int)t[j].cols, 1.0f, got), 0);
    for (int64_t k = 0; k < t[j].rows * t[j].cols; k++)
      if (kn_f32_bits(got[k]) != kn_f32_bits(expect(j, k, t[j].dt))) {
        th_fail(__FILE__, __LINE__, "%s [%lld]: %.9g, want %.9g", t[j].name, (long long)k, got[k],
                expect(j, k, t[j].dt));
        break;
      }
  }
  TH_CHECK_EQ_INT(seen, n);
  /* spot checks of the placement itself */
  TH_CHECK(l->mods[0][MD_LORA_V].a && l->mods[0][MD_LORA_V].b);
  TH_CHECK(!l->mods[1][MD_LORA_K].a && !l->mods[1][MD_LORA_K].b);
  TH_CHECK(!l->mods[2][MD_LORA_V].a && !l->mods[2][MD_LORA_V].b);
  TH_CHECK(l->mods[3][MD_LORA_K].a && l->mods[3][MD_LORA_V].b); /* KV-shared: kept */
  TH_CHECK(!l->mods[3][MD_LORA_Q].a);
  const struct md_tensor *b = l->mods[2][MD_LORA_Q].b; /* [8, 4] */
  TH_REQUIRE(b && b->shape[0] == 8 && b->shape[1] == 4);
  TH_CHECK_EQ_STR(b->name, ROOT "language_model.model.layers.2.self_attn.q_proj.lora_B.weight");
  /* slices with offsets, times a multiplier, and nothing written past them: layer 2's
   * q B [8, 4] (f32, t[19]), k A [4, 10] and B [8, 4] (f16, t[20], t[21]), o A [4, 8]
   * (bf16, t[22]) */
  static const struct {
    enum md_lora_mod m;
    int is_b, j, r0, nr, c0, nc;
  } sl[] = {
      {MD_LORA_Q, 1, 19, 1, 2, 2, 2},
      {MD_LORA_K, 0, 20, 1, 3, 7, 3},
      {MD_LORA_K, 1, 21, 5, 3, 0, 4},
      {MD_LORA_O, 0, 22, 2, 1, 3, 5},
  };
  for (size_t i = 0; i < sizeof(sl) / sizeof(sl[0]); i++) {
    const struct md_lora_mod_w *w = &l->mods[2][sl[i].m];
    const struct md_tensor *s = sl[i].is_b ? w->b : w->a;
    int j = sl[i].j, r0 = sl[i].r0, nr = sl[i].nr, c0 = sl[i].c0, nc = sl[i].nc;
    TH_REQUIRE(s && !strcmp(s->name, t[j].name));
    float got[16];
    for (int k = 0; k < 16; k++)
      got[k] = -12345.0f;
    TH_CHECK_EQ_INT(md_lora_read_f32(s, r0, nr, c0, nc, 0.5f, got), 0);
    for (int r = 0; r < nr; r++)
      for (int cc = 0; cc < nc; cc++) {
        float want = expect(j, (int64_t)(r0 + r) * t[j].cols + c0 + cc, t[j].dt) * 0.5f;
        if (kn_f32_bits(got[r * nc + cc]) != kn_f32_bits(want))
          th_fail(__FILE__, __LINE__, "%s (%d, %d): %.9g, want %.9g", s->name, r0 + r, c0 + cc,
                  got[r * nc + cc], want);
      }
    for (int k = nr * nc; k < 16; k++)
      TH_CHECK(got[k] == -12345.0f);
  }
  md_lora_close(l);
  md_lora_close(NULL);
  rmdir_all(dir);
}

/* scale: alpha / r, alpha / sqrt(r) with use_rslora, LoraConfig's defaults
 * (r 8, lora_alpha 8) where the file is silent. */
TH_TEST(lora_scale_and_defaults) {
  char dir[256];
  TH_REQUIRE(tmpdir(dir, sizeof(dir)) == 0);
  struct {
    const char *config;
    int r;
    double alpha, scale;
    int rslora;
  } cases[] = {
      {"{\"r\": 4, \"lora_alpha\": 16, \"use_rslora\": true}", 4, 16, 8, 1},
      {"{\"r\": 16, \"lora_alpha\": 8, \"use_rslora\": true}", 16, 8, 2, 1},
      {"{\"r\": 4, \"lora_alpha\": 3}", 4, 3, 0.75, 0},
      {"{\"r\": 4, \"lora_alpha\": 2.5}", 4, 2.5, 0.625, 0},
      {"{\"r\": 4}", 4, 8, 2, 0},
      {"{}", 8, 8, 1, 0},
      {"{\"r\": 512, \"lora_alpha\": 32, \"peft_type\": null}", 512, 32, 0.0625, 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct tt t[2];
    mod_pair(t, "model.", 1, MD_LORA_UP, cases[i].r, MD_ST_BF16);
    write_adapter(dir, cases[i].config, t, 2);
    struct md_config c;
    tiny_cfg(&c);
    struct md_lora *l = NULL;
    char err[512] = "";
    int rc = md_lora_open(dir, &c, &l, err, sizeof(err));
    if (rc || !l || l->rank != cases[i].r || l->alpha != cases[i].alpha ||
        l->scale != cases[i].scale || l->rslora != cases[i].rslora || l->n_adapted != 1 ||
        l->base_model[0])
      th_fail(__FILE__, __LINE__, "case %zu: rc %d (%s) rank %d alpha %g scale %g rslora %d", i, rc,
              err, l ? l->rank : -1, l ? l->alpha : -1, l ? l->scale : -1, l ? l->rslora : -1);
    md_lora_close(l);
  }
  /* a long base model name is cut to fit, NUL-terminated */
  char config[600];
  char name[400];
  memset(name, 'x', sizeof(name) - 1);
  name[sizeof(name) - 1] = 0;
  snprintf(config, sizeof(config), "{\"r\": 4, \"base_model_name_or_path\": \"%s\"}", name);
  struct tt t[2];
  mod_pair(t, "model.", 0, MD_LORA_O, 4, MD_ST_F16);
  write_adapter(dir, config, t, 2);
  struct md_config c;
  tiny_cfg(&c);
  struct md_lora *l = NULL;
  char err[512] = "";
  TH_REQUIRE(md_lora_open(dir, &c, &l, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(strlen(l->base_model), sizeof(l->base_model) - 1);
  TH_CHECK(!strncmp(l->base_model, name, sizeof(l->base_model) - 1));
  md_lora_close(l);
  rmdir_all(dir);
}

TH_TEST(lora_config_refusals) {
  char dir[256];
  TH_REQUIRE(tmpdir(dir, sizeof(dir)) == 0);
  struct tt t[2];
  mod_pair(t, "model.", 0, MD_LORA_Q, 4, MD_ST_F32);
  struct {
    const char *config;
    int rc;
    const char *says;
  } cases[] = {
      {"[1, 2]", CM_ERR_PARSE, "not a JSON object"},
      {"{\"r\": 4,", CM_ERR_PARSE, "adapter_config.json"},
      {"{\"r\": 4, \"r\": 4}", CM_ERR_PARSE, "adapter_config.json"},
      {"{\"r\": 4, \"peft_type\": \"LOHA\"}", CM_ERR_UNSUPPORTED, "peft_type is \"LOHA\""},
      {"{\"r\": 4, \"peft_type\": 1}", CM_ERR_PARSE, "peft_type"},
      {"{\"r\": 0}", CM_ERR_RANGE, "r = 0"},
      {"{\"r\": 513}", CM_ERR_RANGE, "r = 513"},
      {"{\"r\": -4}", CM_ERR_RANGE, "r = -4"},
      {"{\"r\": \"4\"}", CM_ERR_PARSE, "r is not an integer"},
      {"{\"r\": 4.5}", CM_ERR_PARSE, "r is not an integer"},
      {"{\"r\": 4, \"lora_alpha\": \"16\"}", CM_ERR_PARSE, "lora_alpha"},
      {"{\"r\": 4, \"use_rslora\": \"yes\"}", CM_ERR_PARSE, "use_rslora"},
      {"{\"r\": 4, \"use_rslora\": 1}", CM_ERR_PARSE, "use_rslora"},
      {"{\"r\": 4, \"base_model_name_or_path\": 3}", CM_ERR_PARSE, "base_model_name_or_path"},
      {"{\"r\": 4, \"bias\": \"all\"}", CM_ERR_UNSUPPORTED, "bias is \"all\""},
      {"{\"r\": 4, \"bias\": \"lora_only\"}", CM_ERR_UNSUPPORTED, "bias is \"lora_only\""},
      {"{\"r\": 4, \"bias\": false}", CM_ERR_PARSE, "bias"},
      {"{\"r\": 4, \"use_dora\": true}", CM_ERR_UNSUPPORTED, "use_dora"},
      {"{\"r\": 4, \"fan_in_fan_out\": true}", CM_ERR_UNSUPPORTED, "fan_in_fan_out"},
      {"{\"r\": 4, \"modules_to_save\": [\"lm_head\"]}", CM_ERR_UNSUPPORTED, "modules_to_save"},
      {"{\"r\": 4, \"rank_pattern\": {\"q_proj\": 8}}", CM_ERR_UNSUPPORTED, "rank_pattern"},
      {"{\"r\": 4, \"alpha_pattern\": {\"q_proj\": 8}}", CM_ERR_UNSUPPORTED, "alpha_pattern"},
      {"{\"r\": 4, \"layer_replication\": [[0, 2], [1, 4]]}", CM_ERR_UNSUPPORTED,
       "layer_replication"},
      {"{\"r\": 4, \"lora_bias\": true}", CM_ERR_UNSUPPORTED, "lora_bias"},
      {"{\"r\": 4, \"use_qalora\": true}", CM_ERR_UNSUPPORTED, "use_qalora"},
      {"{\"r\": 4, \"target_parameters\": [\"mlp.experts.gate_up_proj\"]}", CM_ERR_UNSUPPORTED,
       "target_parameters"},
      {"{\"r\": 4, \"trainable_token_indices\": [5, 6]}", CM_ERR_UNSUPPORTED,
       "trainable_token_indices"},
      {"{\"r\": 4, \"alora_invocation_tokens\": [7]}", CM_ERR_UNSUPPORTED,
       "alora_invocation_tokens"},
      {"{\"r\": 4, \"arrow_config\": {\"top_k\": 2}}", CM_ERR_UNSUPPORTED, "arrow_config"},
      {"{\"r\": 4, \"use_bdlora\": {\"nblocks\": 2}}", CM_ERR_UNSUPPORTED, "use_bdlora"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    REFUSED(cases[i].config, t, 2, cases[i].rc, "adapter_config.json", cases[i].says);
  /* the same settings at their "off" values open */
  const char *off =
      "{\"r\": 4, \"peft_type\": \"LORA\", \"bias\": \"none\", \"use_dora\": false,"
      " \"fan_in_fan_out\": false, \"modules_to_save\": [], \"rank_pattern\": {},"
      " \"alpha_pattern\": {}, \"layer_replication\": null, \"lora_bias\": false,"
      " \"use_qalora\": false, \"target_parameters\": [], \"trainable_token_indices\": null,"
      " \"alora_invocation_tokens\": null, \"arrow_config\": null, \"use_bdlora\": null,"
      " \"lora_alpha\": 4, \"base_model_name_or_path\": null}";
  write_adapter(dir, off, t, 2);
  struct md_config c;
  tiny_cfg(&c);
  struct md_lora *l = NULL;
  char err[512] = "";
  int rc = md_lora_open(dir, &c, &l, err, sizeof(err));
  if (rc) th_fail(__FILE__, __LINE__, "off settings: %d %s", rc, err);
  TH_CHECK(l && l->scale == 1.0 && !l->base_model[0]);
  md_lora_close(l);
  /* no adapter_config.json, and a config too large to be one */
  REFUSED(NULL, t, 2, CM_ERR_NOENT, "adapter_config.json", "missing");
  size_t big = (1u << 20) + 16;
  char *huge = malloc(big + 1);
  TH_REQUIRE(huge);
  memset(huge, ' ', big);
  huge[0] = '{', huge[big - 1] = '}', huge[big] = 0;
  REFUSED(huge, t, 2, CM_ERR_TOOBIG, "adapter_config.json", NULL);
  free(huge);
  rmdir_all(dir);
}

TH_TEST(lora_tensor_refusals) {
  char dir[256];
  TH_REQUIRE(tmpdir(dir, sizeof(dir)) == 0);
  const char *cfg4 = "{\"r\": 4, \"lora_alpha\": 8}";
  struct tt t[4];
  /* parts of the checkpoint that are not the language model's layers */
  struct {
    const char *name;
    const char *says;
  } foreign[] = {
      {ROOT "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.lora_A.weight",
       "adapts the vision tower"},
      {ROOT "model.audio_tower.conformer.0.attention.attn.q_proj.lora_A.weight",
       "adapts the audio tower"},
      {ROOT "model.multi_modal_projector.mm_input_projection.lora_A.weight",
       "adapts the multimodal projector"},
      {ROOT "model.embed_vision.embedding_projection.lora_A.weight", "adapts the vision embedder"},
      {ROOT "model.embed_audio.embedding_projection.lora_A.weight", "adapts the audio embedder"},
      {ROOT "lm_head.lora_A.weight", "lm_head"},
      {ROOT "model.embed_tokens.lora_embedding_A", "token embeddings"},
      {ROOT "model.language_model.embed_tokens_per_layer.lora_A.weight", "token embeddings"},
      {ROOT "model.layers.0.self_attn.q_proj.lora_magnitude_vector", "DoRA"},
      /* names PEFT does not save, or modules that take no adapter here */
      {ROOT "model.layers.0.self_attn.q_proj.lora_A.default.weight", "is not a LoRA weight"},
      {ROOT "model.layers.0.self_attn.q_proj.lora_B.bias", "is not a LoRA weight"},
      {ROOT "model.layers.0.per_layer_input_gate.lora_A.weight", "is not a LoRA weight"},
      {ROOT "model.layers.0.self_attn.q_norm.lora_A.weight", "is not a LoRA weight"},
      {ROOT "model.layers.0.mlp.q_proj.lora_A.weight", "is not a LoRA weight"},
      {ROOT "model.layers.0.self_attn.up_proj.lora_A.weight", "is not a LoRA weight"},
      {ROOT "model.layers.01.self_attn.q_proj.lora_A.weight", "is not a LoRA weight"},
      {ROOT "model.layers.-1.self_attn.q_proj.lora_A.weight", "is not a LoRA weight"},
      {ROOT "model.layers.x.self_attn.q_proj.lora_A.weight", "is not a LoRA weight"},
      {ROOT "transformer.layers.0.self_attn.q_proj.lora_A.weight", "is not a LoRA weight"},
      {ROOT "model.model.layers.0.self_attn.q_proj.lora_A.weight", "is not a LoRA weight"},
      {"model.layers.0.self_attn.q_proj.lora_A.weight", "is not a LoRA weight"},
      {ROOT "model.layers.0.self_attn.q_proj.lora_A.weightx", "is not a LoRA weight"},
  };
  for (size_t i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++) {
    mod_pair(t, "model.", 1, MD_LORA_Q, 4, MD_ST_F32);
    snprintf(t[2].name, sizeof(t[2].name), "%s", foreign[i].name);
    t[2].dt = MD_ST_F32, t[2].rows = 4, t[2].cols = 10;
    REFUSED(cfg4, t, 3, CM_ERR_UNSUPPORTED, foreign[i].name, foreign[i].says);
  }
  /* layers the model does not have */
  mod_pair(t, "model.", 4, MD_LORA_Q, 4, MD_ST_F32); /* widths: none, made up */
  t[0].cols = 10, t[1].rows = 6;
  REFUSED(cfg4, t, 2, CM_ERR_RANGE, "layers.4.self_attn.q_proj.lora_", "the model has 4 layers");
  snprintf(t[0].name, sizeof(t[0].name),
           ROOT "model.layers.99999999999999999999.mlp.up_proj.lora_A.weight");
  REFUSED(cfg4, t, 1, CM_ERR_RANGE, "99999999999999999999", "the model has 4 layers");
  /* v_proj on the k_eq_v layer 2 (given layer 0's widths: the layer, not the shape, is refused) */
  mod_pair(t, "model.", 0, MD_LORA_V, 4, MD_ST_F32);
  for (int k = 0; k < 2; k++) {
    char *d = strstr(t[k].name, "layers.0.");
    d[7] = '2';
  }
  REFUSED(cfg4, t, 2, CM_ERR_INVAL, "layers.2.self_attn.v_proj", "has no v_proj");
  /* A without B, and B without A */
  mod_pair(t, "model.language_model.", 1, MD_LORA_GATE, 4, MD_ST_BF16);
  mod_pair(t + 2, "model.language_model.", 1, MD_LORA_Q, 4, MD_ST_BF16);
  REFUSED(cfg4, t, 1, CM_ERR_INVAL,
          ROOT "model.language_model.layers.1.mlp.gate_proj has lora_A but no lora_B", NULL);
  REFUSED(cfg4, t + 1, 3, CM_ERR_INVAL,
          ROOT "model.language_model.layers.1.mlp.gate_proj has lora_B but no lora_A", NULL);
  /* shapes: A's in, B's out, the rank, the layer's own widths, dimensions */
  mod_pair(t, "model.", 0, MD_LORA_Q, 4, MD_ST_F16);
  t[0].cols = 9;
  REFUSED(cfg4, t, 2, CM_ERR_SHAPE, "q_proj.lora_A.weight has shape [4, 9]", "expected [4, 10]");
  mod_pair(t, "model.", 0, MD_LORA_Q, 4, MD_ST_F16);
  t[1].rows = 5;
  REFUSED(cfg4, t, 2, CM_ERR_SHAPE, "q_proj.lora_B.weight has shape [5, 4]", "expected [6, 4]");
  mod_pair(t, "model.", 0, MD_LORA_DOWN, 8, MD_ST_F32);
  REFUSED(cfg4, t, 2, CM_ERR_SHAPE, "down_proj.lora_A.weight has shape [8, 7]", "expected [4, 7]");
  mod_pair(t, "model.", 0, MD_LORA_Q, 4, MD_ST_F32); /* sliding widths on the full layer 2 */
  for (int k = 0; k < 2; k++)
    strstr(t[k].name, "layers.0.")[7] = '2';
  REFUSED(cfg4, t, 2, CM_ERR_SHAPE, "layers.2.self_attn.q_proj.lora_B.weight has shape [6, 4]",
          "expected [8, 4]");
  mod_pair(t, "model.", 0, MD_LORA_DOWN, 4, MD_ST_F32); /* ffn 7 on the double-wide layer 3 */
  for (int k = 0; k < 2; k++)
    strstr(t[k].name, "layers.0.")[7] = '3';
  REFUSED(cfg4, t, 2, CM_ERR_SHAPE, "layers.3.mlp.down_proj.lora_A.weight has shape [4, 7]",
          "expected [4, 14]");
  mod_pair(t, "model.", 0, MD_LORA_O, 4, MD_ST_F32);
  t[0].rows = 1, t[0].cols = 24; /* 24 = 4 x 6 elements, one row */
  REFUSED(cfg4, t, 2, CM_ERR_SHAPE, "o_proj.lora_A.weight has shape [1, 24]", "expected [4, 6]");
  /* dtypes */
  mod_pair(t, "model.", 0, MD_LORA_K, 4, MD_ST_F32);
  t[1].dt = MD_ST_I32;
  REFUSED(cfg4, t, 2, CM_ERR_UNSUPPORTED, "k_proj.lora_B.weight is I32", "F32, F16 or BF16");
  t[1].dt = MD_ST_F8E4M3;
  REFUSED(cfg4, t, 2, CM_ERR_UNSUPPORTED, "k_proj.lora_B.weight is F8_E4M3", "F32, F16 or BF16");
  /* one module under two prefixes */
  mod_pair(t, "model.", 0, MD_LORA_UP, 4, MD_ST_F32);
  mod_pair(t + 2, "language_model.", 0, MD_LORA_UP, 4, MD_ST_F32);
  REFUSED(cfg4, t, 4, CM_ERR_INVAL, "are both layer 0's up_proj lora_", NULL);
  rmdir_all(dir);
}

TH_TEST(lora_files) {
  char dir[256];
  TH_REQUIRE(tmpdir(dir, sizeof(dir)) == 0);
  const char *cfg4 = "{\"r\": 4}";
  struct tt t[2];
  mod_pair(t, "model.", 0, MD_LORA_Q, 4, MD_ST_BF16);
  /* a pickle file alone: never read */
  write_adapter(dir, cfg4, t, -1);
  mdt_write_text(dir, "adapter_model.bin", "PK\x03\x04 not read");
  REFUSED(cfg4, t, -1, CM_ERR_UNSUPPORTED, "adapter_model.bin", "only safetensors adapters load");
  char p[4200];
  snprintf(p, sizeof(p), "%s/adapter_model.bin", dir);
  unlink(p);
  REFUSED(cfg4, t, -1, CM_ERR_NOENT, "adapter_model.safetensors: missing", NULL);
  /* a safetensors file cut short: in the data, in the header, before the length */
  snprintf(p, sizeof(p), "%s/adapter_model.safetensors", dir);
  const off_t cut[3] = {-6, -(128 + 10), 5}; /* 128 data bytes */
  for (int i = 0; i < 3; i++) {
    write_adapter(dir, cfg4, t, 2);
    FILE *f = fopen(p, "rb");
    TH_REQUIRE(f);
    fseek(f, 0, SEEK_END);
    off_t len = ftello(f);
    fclose(f);
    TH_REQUIRE(truncate(p, cut[i] < 0 ? len + cut[i] : cut[i]) == 0);
    struct md_config c;
    tiny_cfg(&c);
    struct md_lora *l = NULL;
    char err[512] = "";
    int rc = md_lora_open(dir, &c, &l, err, sizeof(err));
    if (!(rc == CM_ERR_RANGE || rc == CM_ERR_TRUNC) || l ||
        !strstr(err, "adapter_model.safetensors"))
      th_fail(__FILE__, __LINE__, "cut %d: rc %d, err \"%s\"", i, rc, err);
  }
  /* a folder that is not there */
  rmdir_all(dir);
  REFUSED(NULL, t, -1, CM_ERR_NOENT, dir, "adapter_config.json");
}

TH_TEST(lora_read_f32) {
  /* every f16 and bf16 bit pattern, against kernels/kn-dtype.h's conversions */
  uint16_t *h = malloc(65536 * sizeof(*h));
  float *got = malloc(65536 * sizeof(*got));
  TH_REQUIRE(h && got);
  for (int i = 0; i < 65536; i++)
    h[i] = (uint16_t)i;
  struct md_tensor t = {.name = "t",
                        .dtype = MD_ST_F16,
                        .ndim = 2,
                        .shape = {256, 256},
                        .data = h,
                        .nbytes = 65536 * 2};
  TH_CHECK_EQ_INT(md_lora_read_f32(&t, 0, 256, 0, 256, 1.0f, got), 0);
  int bad = 0;
  for (int i = 0; i < 65536; i++)
    bad += kn_f32_bits(got[i]) != kn_f32_bits(kn_f16_to_f32((uint16_t)i));
  TH_CHECK_EQ_INT(bad, 0);
  TH_CHECK(got[0x3c00] == 1.0f && got[0xc000] == -2.0f && got[0x7bff] == 65504.0f);
  TH_CHECK(got[0x0001] == 1.0f / 16777216.0f && got[0x8000] == 0.0f);
  t.dtype = MD_ST_BF16;
  TH_CHECK_EQ_INT(md_lora_read_f32(&t, 0, 256, 0, 256, 1.0f, got), 0);
  bad = 0;
  for (int i = 0; i < 65536; i++)
    bad += kn_f32_bits(got[i]) != (uint32_t)i << 16;
  TH_CHECK_EQ_INT(bad, 0);
  /* f32 [3, 5]: a slice, times 2 */
  float f[15];
  for (int i = 0; i < 15; i++)
    f[i] = (float)i - 7.25f;
  struct md_tensor t32 = {
      .name = "f", .dtype = MD_ST_F32, .ndim = 2, .shape = {3, 5}, .data = f, .nbytes = sizeof(f)};
  float s[4] = {0, 0, 0, 99};
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 1, 1, 2, 3, 2.0f, s), 0);
  TH_CHECK(s[0] == 2 * f[7] && s[1] == 2 * f[8] && s[2] == 2 * f[9] && s[3] == 99);
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 2, 1, 4, 1, 1.0f, s), 0);
  TH_CHECK(s[0] == f[14]);
  /* bounds and kinds */
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 3, 1, 0, 1, 1.0f, s), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 2, 2, 0, 1, 1.0f, s), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 0, 1, 3, 3, 1.0f, s), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, -1, 1, 0, 1, 1.0f, s), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 0, 1, -1, 1, 1.0f, s), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 0, -1, 0, 1, 1.0f, s), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 0, 1, 0, 0x7fffffff, 1.0f, s), CM_ERR_RANGE);
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 0x7fffffff, 0x7fffffff, 0, 1, 1.0f, s), CM_ERR_RANGE);
  s[0] = 42;
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 3, 0, 0, 5, 1.0f, s), 0); /* empty: nothing written */
  TH_CHECK(s[0] == 42);
  TH_CHECK_EQ_INT(md_lora_read_f32(NULL, 0, 1, 0, 1, 1.0f, s), CM_ERR_INVAL);
  t32.dtype = MD_ST_I32;
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 0, 1, 0, 1, 1.0f, s), CM_ERR_INVAL);
  t32.dtype = MD_ST_F32;
  t32.ndim = 1;
  TH_CHECK_EQ_INT(md_lora_read_f32(&t32, 0, 1, 0, 1, 1.0f, s), CM_ERR_INVAL);
  free(h);
  free(got);
}

/* A file of no tensors: every other tensor adapts a module or is refused. */
TH_TEST(lora_empty_adapter) {
  char dir[256];
  TH_REQUIRE(tmpdir(dir, sizeof(dir)) == 0);
  REFUSED("{\"r\": 4}", NULL, 0, CM_ERR_INVAL, "adapter_model.safetensors",
          "adapts no layer of the language model");
  rmdir_all(dir);
}
