/* test-md-lora-gguf.c — LoRA adapters in llama.cpp's GGUF layout (model/md-lora-gguf.c):
 *   - a PEFT adapter (tests/reference/make_lora.py) written as llama.cpp's
 *     convert_lora_to_gguf.py writes it (tests/reference/lora_to_gguf.py, an
 *     independent writer) loads to the PEFT folder's modules, shapes, rank and
 *     scale, and to its values bit for bit (f32; f16 and bf16 as those roundings of
 *     them; a bf16 or f16 folder's own bits), on a Gemma 3 and a Gemma 4 config
 *     (k_eq_v and KV-shared layers, the multimodal prefix);
 *   - llama.cpp's scale: alpha / r, 1 where the alpha is absent or 0;
 *   - every refusal names its key or tensor (a model or mmproj file, another
 *     architecture, aLoRA, Q8_0 and unknown types, embeddings, the head, norms,
 *     unknown names, shapes and ranks that do not fit, an A without its B);
 *   - a file cut short anywhere, a file that is not GGUF and one that is not there
 *     are clear errors; tensors at odd addresses (general.alignment 1) read exactly.
 * The first two skip, loudly, without python3 and numpy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "kernels/kn-dtype.h" /* header only: the roundings, as the oracle */
#include "model/md-config.h"
#include "model/md-gguf.h"
#include "model/md-lora.h"
#include "tests/harness/th-buf.h"
#include "tests/harness/th-gguf.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

/* Three layers: q 32->64, k v 32->32, o 64->32, gate up 32->64, down 64->32. */
static const char g3_config[] =
    "{\"model_type\": \"gemma3_text\", \"vocab_size\": 512, \"hidden_size\": 32, "
    "\"intermediate_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
    "\"num_key_value_heads\": 2, \"head_dim\": 16, \"sliding_window\": 64, \"layer_types\": "
    "[\"sliding_attention\", \"sliding_attention\", \"full_attention\"], "
    "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true, "
    "\"query_pre_attn_scalar\": 16, \"rope_theta\": 1000000.0, \"rope_local_base_freq\": "
    "10000.0, \"architectures\": [\"Gemma3ForCausalLM\"]}";

/* Four layers: 0, 1, 3 sliding (head_dim 16, 2 KV heads), 2 full (head_dim 32, K as
 * V, 1 KV head), 3 KV-shared with a double-wide MLP (128). */
static const char g4_config[] =
    "{\"model_type\": \"gemma4_text\", \"vocab_size\": 512, \"hidden_size\": 32, "
    "\"intermediate_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 2, \"head_dim\": 16, \"global_head_dim\": 32, "
    "\"num_global_key_value_heads\": 1, \"attention_k_eq_v\": true, \"num_kv_shared_layers\": 1, "
    "\"use_double_wide_mlp\": true, \"sliding_window\": 64, \"layer_types\": "
    "[\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\"], "
    "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true, "
    "\"final_logit_softcapping\": 30.0, \"rope_parameters\": {\"sliding_attention\": "
    "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}, \"full_attention\": {\"rope_type\": "
    "\"proportional\", \"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0}}, "
    "\"architectures\": [\"Gemma4ForCausalLM\"]}";

static char root[256]; /* the test's folder, removed at exit */

static void path_in(char *out, size_t n, const char *name) {
  if (!root[0]) TH_REQUIRE(th_tmpdir("lora-gguf", root, sizeof(root)) == 0);
  snprintf(out, n, "%s/%s", root, name);
}

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  TH_REQUIRE(f != NULL && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

/* A folder `name` holding config.json, and the model config read from it. */
static void model(const char *name, const char *config, char *dir, size_t n,
                  struct md_config *cfg) {
  char p[600], err[512] = "";
  path_in(dir, n, name);
  if (mkdir(dir, 0700)) TH_REQUIRE(access(dir, F_OK) == 0); /* made by an earlier test */
  snprintf(p, sizeof(p), "%s/config.json", dir);
  write_file(p, config, strlen(config));
  if (md_config_load(dir, cfg, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "%s: %s", name, err);
    th_stop();
  }
}

static void py(const char *python, const char *script, char *const *args) {
  th_reference_at(__FILE__, __LINE__, python, script, args);
}

static struct md_lora *open_ok(int line, const char *path, const struct md_config *cfg) {
  struct md_lora *l = NULL;
  char err[768] = "";
  int rc = md_lora_open(path, cfg, &l, err, sizeof(err));
  if (rc || !l) {
    th_fail(__FILE__, line, "%s: rc %d: %s", path, rc, err);
    th_stop();
  }
  return l;
}

/* The file name at the end of path. */
static const char *base(const char *path) {
  const char *b = strrchr(path, '/');
  return b ? b + 1 : path;
}

/* md_lora_open(path) must fail with `code` and a one-line err holding each of says[]
 * (NULL-terminated) and the file's name. */
static void refused(int line, const char *path, const struct md_config *cfg, int code,
                    const char *const *says) {
  struct md_lora *l = NULL;
  char err[768] = "";
  int rc = md_lora_open(path, cfg, &l, err, sizeof(err));
  int ok = rc == code && !l && strstr(err, base(path)) && !strchr(err, '\n');
  for (int i = 0; ok && says[i]; i++)
    ok = strstr(err, says[i]) != NULL;
  if (!ok)
    th_fail(__FILE__, line, "%s: rc %d (want %d), err \"%s\" (want \"%s\"%s%s%s)", path, rc, code,
            err, says[0], says[1] ? ", \"" : "", says[1] ? says[1] : "", says[1] ? "\"" : "");
  md_lora_close(l);
}
#define REFUSED(path, cfg, code, ...)                                                              \
  refused(__LINE__, path, cfg, code, (const char *[]){__VA_ARGS__, NULL})

/* ---- the same adapter as its PEFT folder ----------------------------------------- */

enum {
  AS_IS,
  AS_F16,
  AS_BF16
}; /* what the GGUF file holds: the folder's values, or them rounded */

static float rounded(float v, int how) {
  if (how == AS_F16) return kn_f16_to_f32(kn_f32_to_f16(v));
  if (how == AS_BF16) return kn_bf16_to_f32(kn_f32_to_bf16(v));
  return v;
}

/* g (GGUF) against p (the PEFT folder it came from): the same modules, shapes, rank,
 * alpha and scale, and values (bits) as `how` says; gdt the dtype g's tensors have. */
static void same_adapter(int line, const struct md_lora *p, const struct md_lora *g, int how,
                         enum md_st_dtype gdt) {
  TH_CHECK(!p->gguf && g->gguf);
  if (p->rank != g->rank || p->alpha != g->alpha || p->scale != g->scale ||
      p->n_adapted != g->n_adapted || p->n_layers != g->n_layers)
    th_fail(__FILE__, line, "rank %d / %d, alpha %g / %g, scale %g / %g, modules %d / %d", p->rank,
            g->rank, p->alpha, g->alpha, p->scale, g->scale, p->n_adapted, g->n_adapted);
  int bad = 0, values = 0;
  for (int i = 0; i < p->n_layers; i++)
    for (int m = 0; m < MD_LORA_N_MODS; m++)
      for (int b = 0; b < 2; b++) {
        const struct md_tensor *tp = b ? p->mods[i][m].b : p->mods[i][m].a;
        const struct md_tensor *tg = b ? g->mods[i][m].b : g->mods[i][m].a;
        if (!tp || !tg) {
          if (tp || tg)
            th_fail(__FILE__, line, "layer %d %s lora_%c: in %s only", i,
                    md_lora_mod_name((enum md_lora_mod)m), b ? 'B' : 'A', tp ? "PEFT" : "GGUF");
          continue;
        }
        if (tg->ndim != 2 || tg->shape[0] != tp->shape[0] || tg->shape[1] != tp->shape[1] ||
            tg->dtype != gdt) {
          th_fail(__FILE__, line, "%s: [%lld, %lld] %s, PEFT's %s [%lld, %lld]", tg->name,
                  (long long)tg->shape[0], (long long)tg->shape[1], tg->dtype_name, tp->name,
                  (long long)tp->shape[0], (long long)tp->shape[1]);
          continue;
        }
        int rows = (int)tp->shape[0], cols = (int)tp->shape[1];
        float *vp = malloc(sizeof(float) * (size_t)rows * cols);
        float *vg = malloc(sizeof(float) * (size_t)rows * cols);
        TH_REQUIRE(vp && vg);
        TH_CHECK_EQ_INT(md_lora_read_f32(tp, 0, rows, 0, cols, 1.0f, vp), 0);
        TH_CHECK_EQ_INT(md_lora_read_f32(tg, 0, rows, 0, cols, 1.0f, vg), 0);
        for (int k = 0; k < rows * cols; k++, values++) {
          float want = rounded(vp[k], how);
          if (kn_f32_bits(vg[k]) != kn_f32_bits(want) && bad++ < 5)
            th_fail(__FILE__, line, "%s [%d]: %.9g (0x%08x), want %.9g (0x%08x)", tg->name, k,
                    vg[k], kn_f32_bits(vg[k]), want, kn_f32_bits(want));
        }
        free(vp);
        free(vg);
      }
  TH_CHECK_EQ_INT(bad, 0);
  TH_CHECK(values > 1000);
}

static const char *need_python(void) {
  return th_require_numpy("GGUF LoRA adapters against their PEFT folders", "lora_to_gguf.py");
}

/* PEFT folder `name` for the model in mdir (make_lora.py with args), and its GGUF file
 * name.gguf (lora_to_gguf.py --arch arch --outtype outtype), paths into peft and gguf. */
static void make_pair(const char *python, const char *mdir, const char *name, char *const *args,
                      const char *arch, const char *outtype, char *peft, char *gguf) {
  char gname[128];
  path_in(peft, 512, name);
  snprintf(gname, sizeof(gname), "%s-%s.gguf", name, outtype);
  path_in(gguf, 512, gname);
  char *argv[24] = {(char *)mdir, peft};
  int k = 2;
  for (int i = 0; args && args[i] && k < 23; i++)
    argv[k++] = args[i];
  argv[k] = NULL;
  if (access(peft, F_OK)) py(python, "make_lora.py", argv);
  py(python, "lora_to_gguf.py",
     (char *[]){peft, gguf, "--arch", (char *)arch, "--outtype", (char *)outtype, NULL});
}

static void check_pair(int line, const char *peft, const char *gguf, const struct md_config *cfg,
                       int how, enum md_st_dtype gdt) {
  struct md_lora *p = open_ok(line, peft, cfg), *g = open_ok(line, gguf, cfg);
  same_adapter(line, p, g, how, gdt);
  md_lora_close(p);
  md_lora_close(g);
}

TH_TEST(lora_gguf_loads_as_its_peft_folder) {
  const char *python = need_python();
  char g3[512], g4[512], peft[512], gguf[512];
  struct md_config c3, c4;
  model("g3", g3_config, g3, sizeof(g3), &c3);
  model("g4", g4_config, g4, sizeof(g4), &c4);
  char *f32_args[] = {"--rank", "4", "--alpha", "8", "--seed", "1", NULL};
  /* f32 as it is; f16 and bf16 as numpy's and gguf-py's roundings of it */
  make_pair(python, g3, "a32", f32_args, "gemma3", "f32", peft, gguf);
  check_pair(__LINE__, peft, gguf, &c3, AS_IS, MD_ST_F32);
  struct md_lora *g = open_ok(__LINE__, gguf, &c3);
  TH_CHECK_EQ_INT(g->rank, 4);
  TH_CHECK(g->alpha == 8.0 && g->scale == 2.0 && !g->rslora);
  TH_CHECK_EQ_INT(g->n_adapted, 3 * 7);
  const struct md_tensor *qa = g->mods[2][MD_LORA_Q].a, *db = g->mods[1][MD_LORA_DOWN].b;
  TH_REQUIRE(qa && db);
  TH_CHECK_EQ_STR(qa->name, "blk.2.attn_q.weight.lora_a");
  TH_CHECK(qa->shape[0] == 4 && qa->shape[1] == 32);
  TH_CHECK_EQ_STR(db->name, "blk.1.ffn_down.weight.lora_b");
  TH_CHECK(db->shape[0] == 32 && db->shape[1] == 4);
  TH_CHECK_EQ_STR(g->mods[0][MD_LORA_O].a->name, "blk.0.attn_output.weight.lora_a");
  TH_CHECK_EQ_STR(g->mods[0][MD_LORA_GATE].b->name, "blk.0.ffn_gate.weight.lora_b");
  md_lora_close(g);
  make_pair(python, g3, "a32", f32_args, "gemma3", "f16", peft, gguf);
  check_pair(__LINE__, peft, gguf, &c3, AS_F16, MD_ST_F16);
  make_pair(python, g3, "a32", f32_args, "gemma3", "bf16", peft, gguf);
  check_pair(__LINE__, peft, gguf, &c3, AS_BF16, MD_ST_BF16);
  /* a bf16 folder: made f32 by the converter, exactly; an f16 folder kept f16 */
  make_pair(python, g3, "a16b",
            (char *[]){"--rank", "8", "--alpha", "4", "--dtype", "bf16", "--targets",
                       "q_proj,v_proj,down_proj", "--seed", "2", NULL},
            "gemma3", "f32", peft, gguf);
  check_pair(__LINE__, peft, gguf, &c3, AS_IS, MD_ST_F32);
  make_pair(python, g3, "a16",
            (char *[]){"--rank", "2", "--alpha", "16", "--dtype", "f16", "--layers", "0,2",
                       "--seed", "3", NULL},
            "gemma3", "f16", peft, gguf);
  check_pair(__LINE__, peft, gguf, &c3, AS_IS, MD_ST_F16);
  /* Gemma 4 under the multimodal class's prefix: no v on the K-as-V layer, no k or v
     on the KV-shared one, the double-wide MLP there */
  make_pair(python, g4, "a4",
            (char *[]){"--rank", "6", "--alpha", "3", "--prefix", "model.language_model.", "--seed",
                       "4", NULL},
            "gemma4", "f32", peft, gguf);
  check_pair(__LINE__, peft, gguf, &c4, AS_IS, MD_ST_F32);
  g = open_ok(__LINE__, gguf, &c4);
  TH_CHECK(!g->mods[2][MD_LORA_V].a && g->mods[2][MD_LORA_K].a);
  TH_CHECK(!g->mods[3][MD_LORA_K].a && !g->mods[3][MD_LORA_V].a);
  TH_CHECK(g->mods[3][MD_LORA_DOWN].a && g->mods[3][MD_LORA_DOWN].a->shape[1] == 128);
  TH_CHECK_EQ_INT(g->n_adapted, 4 * 7 - 3);
  md_lora_close(g);
  /* the same file against the other architecture */
  REFUSED(gguf, &c3, CM_ERR_INVAL,
          "an adapter for gemma4 (general.architecture), the model is gemma3");
}

/* ---- files changed from a good one (tests/harness/th-gguf.h) --------------------- */

/* The key edit p applied to the file at in, written to out. */
static void edit_pairs(const char *in, const char *out, const struct th_gguf_pair *p) {
  struct md_gguf *g = NULL;
  size_t len, base;
  uint8_t *bytes = th_gguf_slurp(in, &len, &g);
  struct th_gguf_edit e = th_gguf_pair_edit(g, p);
  struct th_buf b = th_gguf_rebuild(g, bytes, len, &e, &base);
  write_file(out, b.p, b.n);
  md_gguf_close(g);
  free(b.p);
  free(bytes);
}

/* Tensor `from` renamed `to` and its dimensions ne[0], ne[1] set to ne0, ne1 where
 * those are not 0, in the file at in, written to out. */
struct rename {
  const char *from, *to;
  uint64_t ne0, ne1;
};

static void rename_cb(const struct md_gguf_tensor *t, char *name, size_t n, uint64_t *ne,
                      void *arg) {
  const struct rename *r = arg;
  if (strcmp(t->name, r->from)) return;
  if (r->to) snprintf(name, n, "%s", r->to);
  if (r->ne0) ne[0] = r->ne0;
  if (r->ne1) ne[1] = r->ne1;
}

static void edit_tensor(const char *in, const char *out, const struct rename *r) {
  struct md_gguf *g = NULL;
  size_t len, base;
  uint8_t *bytes = th_gguf_slurp(in, &len, &g);
  struct th_gguf_edit e = {.tensor = rename_cb, .arg = (void *)r};
  struct th_buf b = th_gguf_rebuild(g, bytes, len, &e, &base);
  write_file(out, b.p, b.n);
  md_gguf_close(g);
  free(b.p);
  free(bytes);
}

static void put_str(struct th_buf *b, const void *v) {
  th_buf_u32(b, MD_GGUF_STRING);
  th_buf_str(b, v);
}

static void put_f32(struct th_buf *b, const void *v) {
  th_buf_u32(b, MD_GGUF_F32);
  th_buf_put(b, v, 4);
}

static void put_u32s(struct th_buf *b, const void *v) {
  (void)v;
  th_buf_u32(b, MD_GGUF_ARRAY);
  th_buf_u32(b, MD_GGUF_U32);
  th_buf_u64(b, 2);
  th_buf_u32(b, 1234);
  th_buf_u32(b, 99);
}

/* The scale of the adapter at `gguf` with adapter.lora.alpha changed by p. */
static double scale_with(const char *gguf, const struct md_config *cfg,
                         const struct th_gguf_pair *p, double *alpha) {
  char out[512];
  path_in(out, sizeof(out), "scale.gguf");
  edit_pairs(gguf, out, p);
  struct md_lora *l = open_ok(__LINE__, out, cfg);
  double s = l->scale;
  *alpha = l->alpha;
  md_lora_close(l);
  return s;
}

TH_TEST(lora_gguf_scale) {
  const char *python = need_python();
  char g3[512], peft[512], gguf[512];
  struct md_config c3;
  model("g3", g3_config, g3, sizeof(g3), &c3);
  make_pair(python, g3, "s", (char *[]){"--rank", "4", "--alpha", "8", "--layers", "1", NULL},
            "gemma3", "f32", peft, gguf);
  double alpha;
  /* alpha / r */
  TH_CHECK(scale_with(gguf, &c3, &(struct th_gguf_pair){0}, &alpha) == 2.0 && alpha == 8.0);
  float v = -6.0f;
  TH_CHECK(scale_with(gguf, &c3, &(struct th_gguf_pair){"adapter.lora.alpha", 0, put_f32, &v},
                      &alpha) == -1.5);
  /* no alpha, or 0: scale 1, whatever the rank (llama.cpp's get_scale) */
  TH_CHECK(scale_with(gguf, &c3, &(struct th_gguf_pair){"adapter.lora.alpha", 1}, &alpha) == 1.0 &&
           alpha == 0.0);
  v = 0.0f;
  TH_CHECK(scale_with(gguf, &c3, &(struct th_gguf_pair){"adapter.lora.alpha", 0, put_f32, &v},
                      &alpha) == 1.0);
  /* names llama.cpp only lists change nothing */
  TH_CHECK(scale_with(gguf, &c3,
                      &(struct th_gguf_pair){"adapter.lora.task_name", 0, put_str, "retrieval"},
                      &alpha) == 2.0);
}

TH_TEST(lora_gguf_refusals) {
  const char *python = need_python();
  char g3[512], peft[512], gguf[512], bad[512];
  struct md_config c3;
  model("g3", g3_config, g3, sizeof(g3), &c3);
  make_pair(python, g3, "r",
            (char *[]){"--rank", "4", "--targets", "q_proj,down_proj", "--layers", "0,1", NULL},
            "gemma3", "f32", peft, gguf);
  path_in(bad, sizeof(bad), "bad.gguf");
  md_lora_close(open_ok(__LINE__, gguf, &c3));

  /* what the file is */
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"general.type", 0, put_str, "model"});
  REFUSED(bad, &c3, CM_ERR_INVAL, "is a model (general.type \"model\"), not a LoRA adapter");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"general.type", 0, put_str, "mmproj"});
  REFUSED(bad, &c3, CM_ERR_INVAL, "vision/audio tower (general.type \"mmproj\")");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"general.type", 0, put_str, "vocab"});
  REFUSED(bad, &c3, CM_ERR_INVAL, "general.type is \"vocab\", not \"adapter\"");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"general.type", 1});
  REFUSED(bad, &c3, CM_ERR_INVAL, "general.type is missing");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"general.type", 0, put_f32, &(float){1}});
  REFUSED(bad, &c3, CM_ERR_PARSE, "general.type is not a string");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"adapter.type", 0, put_str, "control_vector"});
  REFUSED(bad, &c3, CM_ERR_UNSUPPORTED, "adapter.type is \"control_vector\", not \"lora\"");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"adapter.type", 1});
  REFUSED(bad, &c3, CM_ERR_UNSUPPORTED, "adapter.type is missing");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"general.architecture", 0, put_str, "llama"});
  REFUSED(bad, &c3, CM_ERR_INVAL,
          "an adapter for llama (general.architecture), the model is gemma3");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"general.architecture", 1});
  REFUSED(bad, &c3, CM_ERR_PARSE, "general.architecture is missing");
  edit_pairs(gguf, bad,
             &(struct th_gguf_pair){"adapter.alora.invocation_tokens", 0, put_u32s, NULL});
  REFUSED(bad, &c3, CM_ERR_UNSUPPORTED, "adapter.alora.invocation_tokens", "aLoRA");
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"adapter.lora.alpha", 0, put_str, "16"});
  REFUSED(bad, &c3, CM_ERR_PARSE, "adapter.lora.alpha is not a number");
  float inf = 1.0f / 0.0f;
  edit_pairs(gguf, bad, &(struct th_gguf_pair){"adapter.lora.alpha", 0, put_f32, &inf});
  REFUSED(bad, &c3, CM_ERR_RANGE, "adapter.lora.alpha is not finite");
  /* a model file: no general.type, llama.cpp's token_embd.weight */
  {
    char model_like[512];
    path_in(model_like, sizeof(model_like), "model-like.gguf");
    edit_pairs(gguf, model_like, &(struct th_gguf_pair){"general.type", 1});
    edit_tensor(model_like, bad,
                &(struct rename){"blk.0.attn_q.weight.lora_a", "token_embd.weight"});
    REFUSED(bad, &c3, CM_ERR_INVAL,
            "is a model (no general.type, a token_embd.weight), not a LoRA adapter");
  }

  /* tensors: names */
  static const struct {
    const char *to, *says, *also;
  } names[] = {
      {"token_embd.weight.lora_a", "tensor token_embd.weight.lora_a adapts the token embeddings",
       NULL},
      {"output.weight.lora_a", "tensor output.weight.lora_a adapts the output head", NULL},
      {"blk.0.attn_norm.weight", "tensor blk.0.attn_norm.weight replaces a norm's weight", NULL},
      {"blk.0.attn_qq.weight.lora_a", "tensor blk.0.attn_qq.weight.lora_a is not a LoRA weight",
       NULL},
      {"blk.00.attn_q.weight.lora_a", "tensor blk.00.attn_q.weight.lora_a is not a LoRA weight",
       NULL},
      {"blk.0.attn_q.lora_a", "tensor blk.0.attn_q.lora_a is not a LoRA weight", NULL},
      {"blk.0.attn_q.weight.lora_A", "tensor blk.0.attn_q.weight.lora_A is not a LoRA weight",
       NULL},
      {"blk.0.attn_q.weight", "tensor blk.0.attn_q.weight is not a LoRA weight", NULL},
      {"blk.0.attn_q_norm.weight.lora_a",
       "tensor blk.0.attn_q_norm.weight.lora_a is not a LoRA weight", NULL},
      {"blk.3.attn_q.weight.lora_a", "tensor blk.3.attn_q.weight.lora_a: layer 3, the model has 3",
       NULL},
      {"blk.99999.attn_q.weight.lora_a", "layer >= 256, the model has 3 layers", NULL},
      {"v.blk.0.attn_q.weight.lora_a", "tensor v.blk.0.attn_q.weight.lora_a is not", NULL},
  };
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    edit_tensor(gguf, bad, &(struct rename){"blk.0.attn_q.weight.lora_a", names[i].to});
    struct md_lora *l = NULL;
    char err[768] = "";
    int rc = md_lora_open(bad, &c3, &l, err, sizeof(err));
    if (rc >= 0 || l || !strstr(err, names[i].says) || !strstr(err, "bad.gguf"))
      th_fail(__FILE__, __LINE__, "%s: rc %d, err \"%s\" (want \"%s\")", names[i].to, rc, err,
              names[i].says);
    md_lora_close(l);
  }
  /* an A without its B (layer 1's B renamed to layer 2's, which has no A) */
  edit_tensor(gguf, bad,
              &(struct rename){"blk.1.attn_q.weight.lora_b", "blk.2.attn_q.weight.lora_b"});
  REFUSED(bad, &c3, CM_ERR_INVAL, "blk.1.attn_q.weight has lora_a but no lora_b");

  /* shapes: A's ne [in, r], B's ne [r, out] against the model, one rank throughout */
  edit_tensor(gguf, bad, &(struct rename){"blk.0.attn_q.weight.lora_a", NULL, 16, 0});
  REFUSED(bad, &c3, CM_ERR_SHAPE,
          "tensor blk.0.attn_q.weight.lora_a has ne [16, 4], expected "
          "[32, r]");
  edit_tensor(gguf, bad, &(struct rename){"blk.1.ffn_down.weight.lora_b", NULL, 0, 16});
  REFUSED(bad, &c3, CM_ERR_SHAPE,
          "tensor blk.1.ffn_down.weight.lora_b has ne [4, 16], expected "
          "[r, 32]");
  edit_tensor(gguf, bad, &(struct rename){"blk.1.attn_q.weight.lora_a", NULL, 0, 3});
  REFUSED(bad, &c3, CM_ERR_SHAPE,
          "tensor blk.1.attn_q.weight.lora_a has rank 3, tensor "
          "blk.0.ffn_down.weight.lora_a rank 4");
  /* a transposed A (ne [r, in]: llama.cpp's "lora_a tensor is not transposed") */
  edit_tensor(gguf, bad, &(struct rename){"blk.0.ffn_down.weight.lora_a", NULL, 4, 16});
  REFUSED(bad, &c3, CM_ERR_SHAPE,
          "tensor blk.0.ffn_down.weight.lora_a has ne [4, 16], expected "
          "[64, r]");

  /* quantized: the converter's --outtype q8_0 (B, of rank 4, falls back to f16) */
  char q8[512];
  make_pair(python, g3, "r", NULL, "gemma3", "q8_0", peft, q8);
  REFUSED(q8, &c3, CM_ERR_UNSUPPORTED, "tensor blk.0.ffn_down.weight.lora_a is q8_0",
          "F32, F16 or BF16");
  /* rsLoRA has no GGUF form: the converter would write alpha as it is */
  char rs[512], err[1024];
  path_in(rs, sizeof(rs), "rs");
  py(python, "make_lora.py", (char *[]){g3, rs, "--rslora", NULL});
  TH_CHECK(th_reference_run(python, "lora_to_gguf.py",
                            (char *[]){rs, bad, "--arch", "gemma3", NULL}, err, sizeof(err)) == 2 &&
           strstr(err, "use_rslora"));
}

/* ---- files made by hand ---------------------------------------------------------- */

struct ht {
  const char *name;
  int n_dims;
  uint64_t ne[3];
  uint32_t type;
  const void *data;
  size_t nbytes;
  size_t gap; /* bytes left before the tensor (a multiple of the alignment) */
};

/* A Gemma 3 adapter file: the four keys (alpha 8), general.alignment when align is not
 * 32, then tensors t[n]. */
static void write_gguf(const char *path, uint32_t align, const struct ht *t, int n) {
  struct th_buf b = {0};
  th_buf_put(&b, "GGUF", 4);
  th_buf_u32(&b, 3);
  th_buf_u64(&b, (uint64_t)n);
  th_buf_u64(&b, align != 32 ? 5 : 4);
  th_buf_str(&b, "general.architecture");
  put_str(&b, "gemma3");
  th_buf_str(&b, "general.type");
  put_str(&b, "adapter");
  th_buf_str(&b, "adapter.type");
  put_str(&b, "lora");
  th_buf_str(&b, "adapter.lora.alpha");
  put_f32(&b, &(float){8});
  if (align != 32) {
    th_buf_str(&b, "general.alignment");
    th_buf_u32(&b, MD_GGUF_U32);
    th_buf_u32(&b, align);
  }
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    off += t[i].gap;
    th_buf_str(&b, t[i].name);
    th_buf_u32(&b, (uint32_t)t[i].n_dims);
    for (int d = 0; d < t[i].n_dims; d++)
      th_buf_u64(&b, t[i].ne[d]);
    th_buf_u32(&b, t[i].type);
    th_buf_u64(&b, off);
    off += t[i].nbytes;
    off = (off + align - 1) / align * align;
  }
  th_buf_pad(&b, align);
  for (int i = 0; i < n; i++) {
    for (size_t k = 0; k < t[i].gap; k++)
      th_buf_put(&b, "\x5a", 1);
    th_buf_put(&b, t[i].data, t[i].nbytes);
    th_buf_pad(&b, align);
  }
  write_file(path, b.p, b.n);
  free(b.p);
}

TH_TEST(lora_gguf_odd_addresses) {
  struct md_config c3;
  char g3[512], path[512];
  model("g3h", g3_config, g3, sizeof(g3), &c3);
  path_in(path, sizeof(path), "odd.gguf");
  /* layer 1's k (32 -> 32) in f16 and bf16, layer 0's up in f32, rank 3, each at an odd
     offset from an odd data section */
  enum { R = 3, H = 32, F = 64 };
  static uint16_t ka[R * H], kb[H * R];
  static float ua[R * H], ub[F * R];
  for (int i = 0; i < R * H; i++) {
    ka[i] = (uint16_t)(0x3000 + i * 37 % 0x1000 + (i % 3 ? 0 : 0x8000)); /* f16 */
    ua[i] = (float)(i % 17) * 0.125f - 1.0f;
  }
  for (int i = 0; i < H * R; i++)
    kb[i] = (uint16_t)(0x3c00 + i * 11 % 0x300 + (i % 2 ? 0x8000 : 0)); /* bf16 */
  for (int i = 0; i < F * R; i++)
    ub[i] = 1.0f / (float)(i + 1);
  struct ht t[] = {
      {"blk.1.attn_k.weight.lora_a", 2, {H, R}, MD_GGML_F16, ka, sizeof(ka), 1},
      {"blk.1.attn_k.weight.lora_b", 2, {R, H}, MD_GGML_BF16, kb, sizeof(kb), 3},
      {"blk.0.ffn_up.weight.lora_a", 2, {H, R}, MD_GGML_F32, ua, sizeof(ua), 1},
      {"blk.0.ffn_up.weight.lora_b", 2, {R, F}, MD_GGML_F32, ub, sizeof(ub), 2},
  };
  write_gguf(path, 1, t, 4);
  struct md_lora *l = open_ok(__LINE__, path, &c3);
  TH_CHECK(l->rank == R && l->n_adapted == 2 && l->scale == 8.0 / 3.0);
  const struct md_tensor *a = l->mods[1][MD_LORA_K].a, *b = l->mods[1][MD_LORA_K].b;
  const struct md_tensor *ua_t = l->mods[0][MD_LORA_UP].a, *ub_t = l->mods[0][MD_LORA_UP].b;
  TH_REQUIRE(a && b && ua_t && ub_t);
  TH_CHECK(((uintptr_t)a->data & 1) || ((uintptr_t)b->data & 1) || ((uintptr_t)ua_t->data & 3));
  float got[F * R];
  TH_CHECK_EQ_INT(md_lora_read_f32(a, 0, R, 0, H, 1.0f, got), 0);
  for (int i = 0; i < R * H; i++)
    TH_CHECK(kn_f32_bits(got[i]) == kn_f32_bits(kn_f16_to_f32(ka[i])));
  TH_CHECK_EQ_INT(md_lora_read_f32(b, 0, H, 0, R, 1.0f, got), 0);
  for (int i = 0; i < H * R; i++)
    TH_CHECK(kn_f32_bits(got[i]) == kn_f32_bits(kn_bf16_to_f32(kb[i])));
  TH_CHECK_EQ_INT(md_lora_read_f32(ua_t, 1, 2, 5, 7, 1.0f, got), 0); /* a slice */
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 7; c++)
      TH_CHECK(got[r * 7 + c] == ua[(r + 1) * H + 5 + c]);
  TH_CHECK_EQ_INT(md_lora_read_f32(ub_t, 0, F, 0, R, 2.0f, got), 0);
  for (int i = 0; i < F * R; i++)
    TH_CHECK(got[i] == 2.0f * ub[i]);
  md_lora_close(l);

  /* a type llama.cpp knows and this project does not, a 3-D tensor */
  struct ht u[] = {t[0], t[1]};
  u[0].gap = u[1].gap = 0;
  u[0].type = 39;
  write_gguf(path, 32, u, 2);
  REFUSED(path, &c3, CM_ERR_UNSUPPORTED, "tensor blk.1.attn_k.weight.lora_a is type 39");
  u[0] = t[0];
  u[0].gap = 0;
  u[0].n_dims = 3;
  u[0].ne[2] = 1;
  write_gguf(path, 32, u, 2);
  REFUSED(path, &c3, CM_ERR_SHAPE, "tensor blk.1.attn_k.weight.lora_a has ne [32, 3, 1]");
  u[0] = t[0];
  u[0].gap = 0;
  u[0].ne[0] = 0; /* no elements, no bytes: the GGUF reader refuses it */
  u[0].nbytes = 0;
  write_gguf(path, 32, u, 2);
  REFUSED(path, &c3, CM_ERR_SHAPE, "tensor blk.1.attn_k.weight.lora_a: dimension 0 is 0");
  /* no tensors at all */
  write_gguf(path, 32, u, 0);
  REFUSED(path, &c3, CM_ERR_INVAL, "adapts no layer of the language model");
}

TH_TEST(lora_gguf_bad_files) {
  struct md_config c3;
  char g3[512], path[512], cut[512];
  model("g3b", g3_config, g3, sizeof(g3), &c3);
  path_in(path, sizeof(path), "good.gguf");
  path_in(cut, sizeof(cut), "cut.gguf");
  enum { R = 2, H = 32 };
  static float a[R * H], b[H * R];
  for (int i = 0; i < R * H; i++)
    a[i] = b[i] = (float)i;
  struct ht t[] = {
      {"blk.2.attn_k.weight.lora_a", 2, {H, R}, MD_GGML_F32, a, sizeof(a), 0},
      {"blk.2.attn_k.weight.lora_b", 2, {R, H}, MD_GGML_F32, b, sizeof(b), 0},
  };
  write_gguf(path, 32, t, 2);
  md_lora_close(open_ok(__LINE__, path, &c3));
  FILE *f = fopen(path, "rb");
  TH_REQUIRE(f);
  static uint8_t bytes[1 << 16];
  size_t len = fread(bytes, 1, sizeof(bytes), f);
  fclose(f);
  TH_REQUIRE(len > 600 && len < sizeof(bytes));
  /* cut at every length: in the header, the keys, the tensor infos, the data */
  int bad = 0;
  for (size_t n = 0; n < len; n += n < 300 ? 1 : 7) {
    write_file(cut, bytes, n);
    struct md_lora *l = NULL;
    char err[768] = "";
    int rc = md_lora_open(cut, &c3, &l, err, sizeof(err));
    if ((rc >= 0 || l || !strstr(err, "cut.gguf") || strchr(err, '\n')) && bad++ < 5)
      th_fail(__FILE__, __LINE__, "cut at %zu of %zu: rc %d, err \"%s\"", n, len, rc, err);
    md_lora_close(l);
  }
  TH_CHECK_EQ_INT(bad, 0);
  /* counts past the file, a key of 2^63 bytes */
  uint8_t hostile[64];
  memcpy(hostile, bytes, sizeof(hostile));
  for (int k = 0; k < 2; k++) {
    memcpy(hostile, bytes, sizeof(hostile));
    memset(hostile + (k ? 24 : 8), 0xff, 7); /* the tensor count; the first key's length */
    write_file(cut, hostile, sizeof(hostile));
    struct md_lora *l = NULL;
    char err[768] = "";
    int rc = md_lora_open(cut, &c3, &l, err, sizeof(err));
    if (rc >= 0 || l || !strstr(err, "cut.gguf"))
      th_fail(__FILE__, __LINE__, "hostile %d: rc %d, err \"%s\"", k, rc, err);
    md_lora_close(l);
  }
  /* not GGUF; not there */
  write_file(cut, "{\"r\": 8}", 8);
  REFUSED(cut, &c3, CM_ERR_INVAL, "not a folder nor a GGUF file");
  unlink(cut);
  REFUSED(cut, &c3, CM_ERR_NOENT, "missing (no such GGUF adapter file)");
}
