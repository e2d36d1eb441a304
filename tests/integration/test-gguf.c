/* test-gguf.c — `lmserve export-gguf` against llama.cpp: a tiny random Gemma 3
 * (seed 3, whose greedy continuations vary with the prompt) exported with
 * --dtype f32 is run by llama.cpp (gguf-llamacpp.mjs, the prebuilt CPU build
 * of the npm package node-llama-cpp, installed by tools/setup into
 * tools/llamacpp/) and by `lmserve generate --kv-dtype f32`; the greedy tokens
 * must be the same, for prompts shorter and longer than the sliding window
 * (64), so the layer plan, RoPE bases, norms (1 + w) and the tied head all
 * have to be carried over. The bf16 export must load and generate too, and
 * bad input gets a clear error. Skips, loudly, when node or node-llama-cpp is
 * missing. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/md-gguf.h"
#include "tests/harness/th-http.h"
#include "tests/harness/th-llamacpp.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

#define N_GEN 12

static char tmp[256];

/* The test's temporary folder with name in it, in path[300]; the folder goes at exit. */
static void tmp_path(char *path, const char *name) {
  if (!tmp[0]) TH_REQUIRE(th_tmpdir("gguf", tmp, sizeof(tmp)) == 0);
  snprintf(path, 300, "%s/%s", tmp, name);
}

#define lm(o, ...) th_lmserve((o), 120000, __VA_ARGS__, NULL)

/* The integers of s, in order, into ids[max]; their count. */
static int parse_ids(const char *s, int *ids, int max) {
  int n = 0;
  while (s && *s && *s != '\n' && n < max) {
    if (*s >= '0' && *s <= '9') {
      ids[n++] = (int)strtol(s, (char **)&s, 10);
    } else {
      s++;
    }
  }
  return n;
}

/* lmserve's N_GEN greedy ids after prompt (a JSON array) from model, with an
 * f32 KV cache on 2 threads, into ids[N_GEN]. */
static void lmserve_generate(struct th_out *o, const char *model, const char *prompt, int *ids) {
  TH_REQUIRE(lm(o, "generate", "--model", model, "--prompt-ids", prompt, "--max-tokens", "12",
                "--kv-dtype", "f32", "--ignore-eos", "--threads", "2") == 0);
  TH_CHECK_EQ_INT(parse_ids(o->out, ids, N_GEN), N_GEN);
}

/* Where llama.cpp is, in dir[1024]; skips the test when it is not there. */
/* llama.cpp's folder into dir[1024]; NULL, or why it cannot run here. */
static const char *llamacpp_dir(char *dir) {
  if (th_node_major() < 18)
    return "no node 18 or newer on PATH: llama.cpp did not check the GGUF export";
  const char *src = getenv("TH_SOURCE_DIR");
  char pkg[1100];
  snprintf(dir, 1024, "%s/tools/llamacpp", src ? src : ".");
  snprintf(pkg, sizeof(pkg), "%s/node_modules/node-llama-cpp/package.json", dir);
  if (access(pkg, R_OK) != 0)
    return "tools/llamacpp/node_modules/node-llama-cpp is missing (run tools/setup): llama.cpp "
           "did not check the GGUF export";
  return NULL;
}

static void need_llamacpp(char *dir) {
  const char *why = llamacpp_dir(dir);
  if (why) TH_SKIP(why);
}

/* need_llamacpp, and its quantizer's library (th_llamacpp_lib). */
static void need_llamacpp_quantizer(char *dir) {
  need_llamacpp(dir);
  const char *no = th_llamacpp_lib();
  if (no) TH_SKIP(no);
}

/* llama.cpp's N_GEN greedy ids after each prompt (a JSON array of arrays) into
 * got[n_prompts][N_GEN]; with gaps, at each step how far its top logit lies
 * above the second into gaps[n_prompts][N_GEN]. */
static void llamacpp_generate_gaps(const char *dir, const char *gguf, const char *prompts,
                                   int n_prompts, int got[][N_GEN], double gaps[][N_GEN]) {
  char script[1024], n[16];
  snprintf(script, sizeof(script), "%s/integration/gguf-llamacpp.mjs", th_tests_dir());
  snprintf(n, sizeof(n), "%d", N_GEN);
  char *argv[] = {"node", script,          (char *)dir,          (char *)gguf,
                  n,      (char *)prompts, gaps ? "gaps" : NULL, NULL};
  char *out = NULL, *err = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 300000, &out, &err);
  if (rc != 0) fprintf(stderr, "gguf-llamacpp.mjs: %s\n", err ? err : "");
  TH_REQUIRE(rc == 0 && out);
  const char *line = out;
  for (int p = 0; p < n_prompts; p++) {
    TH_REQUIRE(line && *line);
    TH_CHECK_EQ_INT(parse_ids(line, got[p], N_GEN), N_GEN);
    line = strchr(line, '\n');
    if (line) line++;
    if (!gaps) continue;
    TH_REQUIRE(line && *line == '[');
    const char *q = line + 1;
    for (int i = 0; i < N_GEN; i++) {
      char *end;
      gaps[p][i] = strtod(q, &end);
      TH_REQUIRE(end != q);
      q = end + 1;
    }
    line = strchr(line, '\n');
    if (line) line++;
  }
  free(out), free(err);
}

static void llamacpp_generate(const char *dir, const char *gguf, const char *prompts, int n_prompts,
                              int got[][N_GEN]) {
  llamacpp_generate_gaps(dir, gguf, prompts, n_prompts, got, NULL);
}

TH_TEST(llamacpp_generates_what_lmserve_does_from_the_export) {
  th_proc_init(900);
  char dir[1024];
  need_llamacpp(dir);
  char model[300], f32[300], bf16[300];
  tmp_path(model, "g3");
  tmp_path(f32, "g3-f32.gguf");
  tmp_path(bf16, "g3-bf16.gguf");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma3", "--seed", "3", "--out", model) == 0);
  TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", f32, "--dtype", "f32") == 0);
  TH_CHECK(strstr(o.out, "gemma3, 6 layers, 80 tensors") != NULL);
  TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", bf16) == 0);

  /* three prompts: short, short, and 100 tokens (past the 64-token window) */
  enum { N_PROMPTS = 3 };
  char prompts[N_PROMPTS][1024], all[4096];
  th_llamacpp_prompts(prompts, all);

  int ours[N_PROMPTS][N_GEN], theirs[N_PROMPTS][N_GEN];
  for (int p = 0; p < N_PROMPTS; p++) {
    lmserve_generate(&o, model, prompts[p], ours[p]);
  }
  llamacpp_generate(dir, f32, all, N_PROMPTS, theirs);
  int distinct = 0;
  for (int p = 0; p < N_PROMPTS; p++) {
    for (int i = 0; i < N_GEN; i++) {
      if (ours[p][i] != theirs[p][i])
        th_fail(__FILE__, __LINE__, "prompt %d, token %d: lmserve %d, llama.cpp %d", p, i,
                ours[p][i], theirs[p][i]);
      distinct += i == 0 || ours[p][i] != ours[p][i - 1];
    }
  }
  /* the check means something only if the continuations are not one repeated token */
  TH_CHECK(distinct >= 6);

  /* the bf16 export (llama.cpp rounds activations to bf16 there: no equality asked) */
  int bf[N_PROMPTS][N_GEN];
  llamacpp_generate(dir, bf16, all, 1, bf);
  th_out_free(&o);
}

/* A flip is allowed only where llama.cpp's top two logits lie this close;
 * after one, the two continuations have different contexts and are not
 * compared. Measured on these models' f32 exports (one step, all 262144
 * logits, less their mean difference): tiny-dense within 0.010 of
 * llama.cpp's (rms 0.002), tiny-e within 0.07 (rms 0.016), of a range of
 * about 4.5. Without its per-layer inputs tiny-e is within 0.02: the
 * per-layer gate is 16 wide, and llama.cpp's GELU reads its input rounded
 * to fp16 (a table), an error that post_per_layer_input_norm scales back up
 * to the residual's size in every layer. */
#define NEAR_TIE 0.05

/* Gemma 4 exports against llama.cpp's gemma4 (src/models/gemma4.cpp):
 * the tiny-e preset (per-layer inputs, KV-shared layers read where llama.cpp
 * reads them, the double-wide MLP, K as V on full layers, layer scalars,
 * proportional RoPE through rope_freqs, final softcap 30), tiny-dense
 * (none of those, no softcap: final_logit_softcapping 0 written, since
 * llama.cpp takes 30 when the key is absent), and tiny-dense with an MoE
 * block on every layer (4 experts, top 2: llama.cpp's router, softmax top-k
 * renormalised, per-expert scale on the down projection, the fused gate_up
 * stack). The f32 export's greedy tokens
 * are lmserve's on the safetensors checkpoint, for prompts shorter and longer
 * than the 64-token window; a token may differ only where llama.cpp's top two
 * are a near-tie. llama.cpp loads and runs the q8_0 and bf16 files too; their
 * tokens are printed, not compared: its Q8_0 dot products round the
 * activations to 8 bits, which moves these random models' logits by up to
 * 0.66 (rms 0.14, measured), and their top tokens lie closer than that
 * (attention at scale 1 over normed q and k is sharp). test-wk-gguf-g4 checks
 * the q8_0 file against lmserve's own quantization, bit for bit. The
 * embedding scales are exact in both (sqrt(64) = 8, sqrt(16) = 4): llama.cpp
 * multiplies by sqrt(hidden) in f32 where transformers, and lmserve, round it
 * to the weights' dtype first. */
TH_TEST(llamacpp_runs_gemma4_exports_as_lmserve_does) {
  th_proc_init(1200);
  char dir[1024];
  need_llamacpp(dir);
  static const struct {
    const char *name;
    int moe;
  } presets[] = {{"tiny-e", 0}, {"tiny-dense", 0}, {"tiny-dense", 1}};
  enum { N_PROMPTS = 3 };
  char prompts[N_PROMPTS][1024], all[4096];
  th_llamacpp_prompts(prompts, all);
  struct th_out o = {0};
  for (size_t pi = 0; pi < sizeof(presets) / sizeof(presets[0]); pi++) {
    char model[300], f32[300], bf16[300], q8[300], name[64];
    const char *pn = presets[pi].name, *moe = presets[pi].moe ? "-moe" : "";
    snprintf(name, sizeof(name), "g4-%s%s", pn, moe);
    tmp_path(model, name);
    snprintf(name, sizeof(name), "g4-%s%s-f32.gguf", pn, moe);
    tmp_path(f32, name);
    snprintf(name, sizeof(name), "g4-%s%s-bf16.gguf", pn, moe);
    tmp_path(bf16, name);
    snprintf(name, sizeof(name), "g4-%s%s-q8_0.gguf", pn, moe);
    tmp_path(q8, name);
    if (presets[pi].moe)
      TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma4", "--preset", pn, "--moe",
                    "--router-gain", "16", "--seed", "3", "--out", model) == 0);
    else
      TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma4", "--preset", pn, "--seed", "3",
                    "--out", model) == 0);
    TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", f32, "--dtype", "f32") == 0);
    TH_CHECK(strstr(o.out, "gemma4, 6 layers") != NULL);
    TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", bf16) == 0);
    TH_REQUIRE(lm(&o, "quantize", model, q8, "q8_0") == 0);
    int ours[N_PROMPTS][N_GEN], theirs[N_PROMPTS][N_GEN], q8ours[N_PROMPTS][N_GEN];
    double gaps[N_PROMPTS][N_GEN];
    for (int p = 0; p < N_PROMPTS; p++) {
      lmserve_generate(&o, model, prompts[p], ours[p]);
      lmserve_generate(&o, q8, prompts[p], q8ours[p]);
    }
    llamacpp_generate_gaps(dir, f32, all, N_PROMPTS, theirs, gaps);
    int distinct = 0, leading = 0, first = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
      int agree = 0;
      while (agree < N_GEN && ours[p][agree] == theirs[p][agree])
        agree++;
      for (int i = 0; i < agree; i++)
        distinct += i == 0 || ours[p][i] != ours[p][i - 1];
      leading += agree;
      first += agree > 0;
      printf("# %s%s f32 prompt %d: %d of %d tokens as llama.cpp's%s\n", pn, moe, p, agree, N_GEN,
             agree == N_GEN    ? ""
             : presets[pi].moe ? " (then parted)"
                               : " (then a near-tie)");
      /* MoE: a near-tie of two experts' router logits, which llama.cpp's
         fp16-table GELU moves by ~1e-3 upstream, sends a token down other
         experts and its logits elsewhere, so a whole continuation can part
         without a near-tie of the top two tokens: the MoE model is held to
         the floor below instead (a prompt's worth of leading tokens, the
         first token of all prompts but one); a wrong layout (gate and up
         swapped, a scale misplaced) agrees on none */
      if (!presets[pi].moe && agree < N_GEN && !(gaps[p][agree] < NEAR_TIE))
        th_fail(__FILE__, __LINE__,
                "%s%s prompt %d, token %d: lmserve %d, llama.cpp %d (its top two %.4f apart)", pn,
                moe, p, agree, ours[p][agree], theirs[p][agree], gaps[p][agree]);
    }
    TH_CHECK(distinct >= 12); /* the continuations are not one repeated token */
    if (presets[pi].moe) {
      TH_CHECK(first >= N_PROMPTS - 1);
      TH_CHECK(leading >= N_GEN);
    }
    llamacpp_generate(dir, q8, all, N_PROMPTS, theirs);
    for (int p = 0; p < N_PROMPTS; p++) {
      int agree = 0;
      while (agree < N_GEN && q8ours[p][agree] == theirs[p][agree])
        agree++;
      printf("# %s%s q8_0 prompt %d: %d of %d tokens as llama.cpp's\n", pn, moe, p, agree, N_GEN);
    }
    llamacpp_generate(dir, bf16, all, 1, theirs);
  }
  th_out_free(&o);
}

/* `lmserve quantize` writes block formats llama.cpp loads, and lmserve runs GGUF files
 * itself: the f32 export through the GGUF path gives the safetensors checkpoint's
 * tokens, and each quantized file gives llama.cpp's tokens until llama.cpp's 8-bit
 * rounding of the activations (its Q4/Q5 dot products take Q8 inputs; lmserve keeps
 * f32 activations, exact to the dequantized weights) moves a near-tie: the first
 * token of every prompt, and for Q8_0 every token of these prompts, agree. */
TH_TEST(quantized_gguf_files_run_in_llamacpp_and_lmserve) {
  th_proc_init(900);
  char dir[1024];
  need_llamacpp(dir);
  char model[300], f32[300];
  tmp_path(model, "q3");
  tmp_path(f32, "q3-f32.gguf");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma3", "--seed", "3", "--out", model) == 0);
  TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", f32, "--dtype", "f32") == 0);
  static const char *prompts[] = {"[2,651,1234,99,5000]",
                                  "[2,7000,7001,7002,8000,123,4567,10,11,12]"};
  enum { N_PROMPTS = 2 };
  char all[512];
  snprintf(all, sizeof(all), "[%s,%s]", prompts[0], prompts[1]);
  int ref[N_PROMPTS][N_GEN], got[N_PROMPTS][N_GEN], theirs[N_PROMPTS][N_GEN];
  for (int p = 0; p < N_PROMPTS; p++) {
    lmserve_generate(&o, model, prompts[p], ref[p]);
    lmserve_generate(&o, f32, prompts[p], got[p]);
    TH_CHECK(!memcmp(ref[p], got[p], sizeof(ref[p])));
  }
  static const char *types[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1"};
  for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
    char q[300], name[32];
    snprintf(name, sizeof(name), "q3-%s.gguf", types[ti]);
    tmp_path(q, name);
    TH_REQUIRE(lm(&o, "quantize", model, q, types[ti]) == 0);
    TH_CHECK(strstr(o.out, types[ti]) != NULL);
    double gaps[N_PROMPTS][N_GEN];
    llamacpp_generate_gaps(dir, q, all, N_PROMPTS, theirs, gaps);
    for (int p = 0; p < N_PROMPTS; p++) {
      lmserve_generate(&o, q, prompts[p], got[p]);
      int agree = 0;
      while (agree < N_GEN && got[p][agree] == theirs[p][agree])
        agree++;
      printf("# %s prompt %d: %d of %d tokens as llama.cpp's\n", types[ti], p, agree, N_GEN);
      TH_CHECK(agree >= (ti == 0 ? N_GEN : 1));
      /* the q8 mode (integer dot products over 8-bit inputs, as llama.cpp's) */
      TH_REQUIRE(lm(&o, "generate", "--model", q, "--prompt-ids", prompts[p], "--max-tokens", "12",
                    "--kv-dtype", "f32", "--ignore-eos", "--threads", "2", "--dtype", "q8") == 0);
      int q8[N_GEN];
      TH_CHECK_EQ_INT(parse_ids(o.out, q8, N_GEN), N_GEN);
      agree = 0;
      while (agree < N_GEN && q8[agree] == theirs[p][agree])
        agree++;
      printf("# %s prompt %d, --dtype q8: %d of %d tokens as llama.cpp's%s\n", types[ti], p, agree,
             N_GEN, agree < N_GEN ? " (then a near-tie)" : "");
      /* the same tokens up to a near-tie of llama.cpp's top two, where the two
       * roundings of the same 8-bit products may go either way */
      if (agree < N_GEN && !(gaps[p][agree] < NEAR_TIE))
        th_fail(__FILE__, __LINE__,
                "%s prompt %d, --dtype q8: token %d is %d, llama.cpp's %d (its top two %.4f apart)",
                types[ti], p, agree, q8[agree], theirs[p][agree], gaps[p][agree]);
    }
  }
  /* bad input */
  TH_CHECK_EQ_INT(lm(&o, "quantize", model, f32, "q3_k"), 2);
  TH_CHECK(strstr(o.err, "q3_k") != NULL);
  TH_CHECK_EQ_INT(lm(&o, "quantize", model, f32), 2);
  char notgguf[320];
  snprintf(notgguf, sizeof(notgguf), "%s/config.json", model);
  TH_CHECK(lm(&o, "generate", "--model", notgguf, "--prompt-ids", "[2]") != 0);
  TH_CHECK(strstr(o.err, "not a GGUF file") != NULL);
  th_out_free(&o);
}

/* The K-quants (and llama.cpp's Q4_K_M mix) on a model whose rows are whole
 * 256-element blocks: llama.cpp loads each file lmserve quantize writes, and
 * its greedy tokens are lmserve's on the same file for at least one of the
 * prompts. Not every prompt: llama.cpp rounds the activations of its K-quant
 * dot products to 8 bits (Q8_K), and this random tiny model's second prompt
 * sits on a near-tie whose winner moves with that rounding (across the types
 * its first token is one of three ids). The tensors hold the types asked,
 * with the Q6_K of the mix. */
TH_TEST(k_quant_gguf_files_run_in_llamacpp_and_lmserve) {
  th_proc_init(900);
  char dir[1024];
  need_llamacpp(dir);
  char model[300];
  tmp_path(model, "k256");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma3", "--preset", "k256", "--seed", "3",
                "--out", model) == 0);
  static const char *prompts[] = {"[2,651,1234,99,5000]",
                                  "[2,7000,7001,7002,8000,123,4567,10,11,12]"};
  enum { N_PROMPTS = 2 };
  char all[512];
  snprintf(all, sizeof(all), "[%s,%s]", prompts[0], prompts[1]);
  static const char *types[] = {"q4_k", "q5_k", "q6_k", "q4_k_m"};
  for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
    char q[300], name[32];
    int theirs[N_PROMPTS][N_GEN], got[N_GEN], best = 0;
    snprintf(name, sizeof(name), "k256-%s.gguf", types[ti]);
    tmp_path(q, name);
    TH_REQUIRE(lm(&o, "quantize", model, q, types[ti]) == 0);
    llamacpp_generate(dir, q, all, N_PROMPTS, theirs);
    for (int p = 0; p < N_PROMPTS; p++) {
      lmserve_generate(&o, q, prompts[p], got);
      int agree = 0;
      while (agree < N_GEN && got[agree] == theirs[p][agree])
        agree++;
      printf("# %s prompt %d: %d of %d tokens as llama.cpp's\n", types[ti], p, agree, N_GEN);
      best = agree > best ? agree : best;
    }
    TH_CHECK_EQ_INT(best, N_GEN);
    /* the types in the file: ggml type ids 12 (Q4_K), 13 (Q5_K), 14 (Q6_K) */
    struct md_gguf *g = NULL;
    char err[256];
    TH_REQUIRE(md_gguf_open(q, &g, err, sizeof(err)) == 0);
    int want = ti == 1 ? 13 : ti == 2 ? 14 : 12;
    const struct md_gguf_tensor *down = md_gguf_find_tensor(g, "blk.1.ffn_down.weight");
    const struct md_gguf_tensor *down5 = md_gguf_find_tensor(g, "blk.5.ffn_down.weight");
    const struct md_gguf_tensor *emb = md_gguf_find_tensor(g, "token_embd.weight");
    TH_REQUIRE(down && down5 && emb);
    TH_CHECK_EQ_INT((int)down->type, want);
    TH_CHECK_EQ_INT((int)down5->type, ti == 3 ? 14 : want);
    TH_CHECK_EQ_INT((int)emb->type, ti == 3 ? 14 : want);
    md_gguf_close(g);
  }
  th_out_free(&o);
}

/* Tensors of GGUF file `theirs` (llama.cpp's quantizer) and `ours` (lmserve
 * quantize): every tensor llama.cpp quantized is in ours with the same type and
 * bytes, except `except` (NULL: none), whose name is returned in differ when it
 * differs. The count of block-format tensors compared. */
static int same_blocks(const char *theirs, const char *ours, const char *except, int *differ) {
  struct md_gguf *a = NULL, *b = NULL;
  char err[512];
  TH_REQUIRE(md_gguf_open(theirs, &a, err, sizeof(err)) == 0);
  TH_REQUIRE(md_gguf_open(ours, &b, err, sizeof(err)) == 0);
  int n = 0;
  *differ = 0;
  for (int i = 0; i < md_gguf_tensor_count(a); i++) {
    const struct md_gguf_tensor *x = md_gguf_tensor_at(a, i);
    if (x->type < MD_GGML_Q4_0 || x->type == MD_GGML_BF16) continue; /* f32, f16, bf16 */
    const struct md_gguf_tensor *y = md_gguf_find_tensor(b, x->name);
    int same =
        y && y->type == x->type && y->nbytes == x->nbytes && !memcmp(y->data, x->data, x->nbytes);
    if (except && !strcmp(x->name, except)) {
      *differ = !same;
      continue;
    }
    if (!same)
      th_fail(__FILE__, __LINE__, "%s: %s is type %u in llama.cpp's file, %d in lmserve's%s", ours,
              x->name, x->type, y ? (int)y->type : -1,
              y && y->type == x->type ? " (other bytes)" : "");
    n++;
  }
  md_gguf_close(a);
  md_gguf_close(b);
  return n;
}

/* llama.cpp's own quantizer (llama_model_quantize, the npm package's libllama)
 * on lmserve's f32 export writes the blocks lmserve quantize writes from the
 * checkpoint, byte for byte: both round as ggml's reference quantizers do, and
 * q4_k_m is llama.cpp's Q4_K_M mix, attn_v by its place among the file's attn_v
 * matrices (Gemma 4's K-as-V layers have none), ffn_down and the MoE experts'
 * ffn_down_exps by their layer. The one difference is by design: llama.cpp's
 * mixes, Q4_0's too, give the tied output matrix Q6_K (Q8_0 where its rows are
 * not whole 256-blocks), where lmserve's plain types are pure. Then llama.cpp's
 * Q4_0 and Q4_K_M files of Gemma 3 run in lmserve's q8 mode as in llama.cpp,
 * up to a near-tie of llama.cpp's top two (test-wk-reference checks the
 * logits of such files against a double-precision reference). */
TH_TEST(llamacpp_quantizer_writes_what_lmserve_quantize_does) {
  th_proc_init(900);
  char dir[1024], err[512];
  need_llamacpp_quantizer(dir);
  static const struct {
    const char *arch, *preset;
    int moe;
  } models[] = {{"gemma3", "k256", 0}, {"gemma4", "tiny-large", 0}, {"gemma4", "tiny-dense", 1}};
  static const struct {
    const char *name;
    int ftype;
  } types[] = {{"q8_0", TH_LLAMA_FTYPE_Q8_0},
               {"q6_k", TH_LLAMA_FTYPE_Q6_K},
               {"q4_k_m", TH_LLAMA_FTYPE_Q4_K_M},
               {"q4_0", TH_LLAMA_FTYPE_Q4_0}};
  struct th_out o = {0};
  for (size_t mi = 0; mi < sizeof(models) / sizeof(models[0]); mi++) {
    char model[300], f32[300], name[64];
    snprintf(name, sizeof(name), "lq-%s%s", models[mi].preset, models[mi].moe ? "-moe" : "");
    tmp_path(model, name);
    snprintf(name, sizeof(name), "lq-%s%s-f32.gguf", models[mi].preset,
             models[mi].moe ? "-moe" : "");
    tmp_path(f32, name);
    if (models[mi].moe)
      TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", models[mi].arch, "--preset", models[mi].preset,
                    "--moe", "--seed", "3", "--out", model) == 0);
    else
      TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", models[mi].arch, "--preset", models[mi].preset,
                    "--seed", "3", "--out", model) == 0);
    TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", f32, "--dtype", "f32") == 0);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
      char theirs[320], ours[320];
      snprintf(theirs, sizeof(theirs), "%s.llamacpp-%s.gguf", model, types[ti].name);
      snprintf(ours, sizeof(ours), "%s.lmserve-%s.gguf", model, types[ti].name);
      if (th_llamacpp_quantize(f32, theirs, types[ti].ftype, err, sizeof(err))) {
        th_fail(__FILE__, __LINE__, "%s", err);
        continue;
      }
      TH_REQUIRE(lm(&o, "quantize", model, ours, types[ti].name) == 0);
      int q40 = types[ti].ftype == TH_LLAMA_FTYPE_Q4_0, differ = 0;
      int n = same_blocks(theirs, ours, q40 ? "token_embd.weight" : NULL, &differ);
      printf("# %s%s %s: %d block tensors as llama.cpp's%s\n", models[mi].preset,
             models[mi].moe ? "+moe" : "", types[ti].name, n,
             q40 ? ", and the tied output matrix Q4_0 (llama.cpp's Q6_K / Q8_0)" : "");
      TH_CHECK(n >= 20);
      if (q40) TH_CHECK(differ);
      if (strcmp(models[mi].arch, "gemma3") || (!q40 && types[ti].ftype != TH_LLAMA_FTYPE_Q4_K_M))
        continue;
      /* llama.cpp's file, in lmserve's q8 mode and in llama.cpp */
      static const char *prompts[] = {"[2,651,1234,99,5000]",
                                      "[2,7000,7001,7002,8000,123,4567,10,11,12]"};
      char all[512];
      snprintf(all, sizeof(all), "[%s,%s]", prompts[0], prompts[1]);
      int their_ids[2][N_GEN];
      double gaps[2][N_GEN];
      llamacpp_generate_gaps(dir, theirs, all, 2, their_ids, gaps);
      for (int p = 0; p < 2; p++) {
        TH_REQUIRE(lm(&o, "generate", "--model", theirs, "--prompt-ids", prompts[p], "--max-tokens",
                      "12", "--kv-dtype", "f32", "--ignore-eos", "--threads", "2", "--dtype",
                      "q8") == 0);
        int got[N_GEN], agree = 0;
        TH_CHECK_EQ_INT(parse_ids(o.out, got, N_GEN), N_GEN);
        while (agree < N_GEN && got[agree] == their_ids[p][agree])
          agree++;
        printf("# llama.cpp's %s file, prompt %d, --dtype q8: %d of %d tokens as llama.cpp's\n",
               types[ti].name, p, agree, N_GEN);
        if (agree < N_GEN && !(gaps[p][agree] < NEAR_TIE))
          th_fail(__FILE__, __LINE__, "%s prompt %d: token %d is %d, llama.cpp's %d (%.4f apart)",
                  types[ti].name, p, agree, got[agree], their_ids[p][agree], gaps[p][agree]);
      }
    }
  }
  th_out_free(&o);
}

/* llama.cpp's 2- and 3-bit and non-linear 4-bit files (its quantizer's Q3_K_M,
 * IQ4_XS, IQ4_NL and Q2_K, which lmserve quantize does not write) load and run as
 * in llama.cpp: the Q3_K, IQ4_XS, IQ4_NL and Q2_K tensors are in the files (IQ4_XS on
 * rows of 64, Gemma 3's tiny preset, falls back to IQ4_NL, as llama.cpp does
 * where rows are not whole 256-blocks), and lmserve's greedy tokens, in the
 * default mode and in the q8 mode, are llama.cpp's up to a near-tie of its
 * top two (it rounds these formats' inputs to 8 bits, Q8_K). */
TH_TEST(llamacpp_lowbit_files_run_as_in_llamacpp) {
  th_proc_init(900);
  char dir[1024], err[512];
  need_llamacpp_quantizer(dir);
  static const struct {
    const char *preset, *name;
    int ftype;
    unsigned type; /* a ggml type the file must hold */
  } cases[] = {{"k256", "q3_k_m", TH_LLAMA_FTYPE_Q3_K_M, MD_GGML_Q3_K},
               {"k256", "iq4_xs", TH_LLAMA_FTYPE_IQ4_XS, MD_GGML_IQ4_XS},
               {"k256", "iq4_nl", TH_LLAMA_FTYPE_IQ4_NL, MD_GGML_IQ4_NL},
               {"k256", "q2_k", TH_LLAMA_FTYPE_Q2_K, MD_GGML_Q2_K},
               {"tiny", "iq4_xs", TH_LLAMA_FTYPE_IQ4_XS, MD_GGML_IQ4_NL}};
  static const char *prompts[] = {"[2,651,1234,99,5000]",
                                  "[2,7000,7001,7002,8000,123,4567,10,11,12]"};
  char all[512];
  snprintf(all, sizeof(all), "[%s,%s]", prompts[0], prompts[1]);
  struct th_out o = {0};
  for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
    char model[300], f32[300], q[300], name[64];
    snprintf(name, sizeof(name), "lb-%s", cases[ci].preset);
    tmp_path(model, name);
    snprintf(name, sizeof(name), "lb-%s-f32.gguf", cases[ci].preset);
    tmp_path(f32, name);
    if (ci == 0 || strcmp(cases[ci].preset, cases[ci - 1].preset)) {
      TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma3", "--preset", cases[ci].preset,
                    "--seed", "3", "--out", model) == 0);
      TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", f32, "--dtype", "f32") == 0);
    }
    snprintf(name, sizeof(name), "lb-%s-%s.gguf", cases[ci].preset, cases[ci].name);
    tmp_path(q, name);
    if (th_llamacpp_quantize(f32, q, cases[ci].ftype, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "%s", err);
      continue;
    }
    struct md_gguf *g = NULL;
    TH_REQUIRE(md_gguf_open(q, &g, err, sizeof(err)) == 0);
    int n_type = 0;
    for (int i = 0; i < md_gguf_tensor_count(g); i++)
      n_type += md_gguf_tensor_at(g, i)->type == cases[ci].type;
    md_gguf_close(g);
    printf("# %s %s: %d tensors of ggml type %u\n", cases[ci].preset, cases[ci].name, n_type,
           cases[ci].type);
    TH_CHECK(n_type >= 4);
    int theirs[2][N_GEN];
    double gaps[2][N_GEN];
    llamacpp_generate_gaps(dir, q, all, 2, theirs, gaps);
    for (int mode = 0; mode < 2; mode++)
      for (int p = 0; p < 2; p++) {
        TH_REQUIRE(lm(&o, "generate", "--model", q, "--prompt-ids", prompts[p], "--max-tokens",
                      "12", "--kv-dtype", "f32", "--ignore-eos", "--threads", "2", "--dtype",
                      mode ? "q8" : "auto") == 0);
        int got[N_GEN], agree = 0;
        TH_CHECK_EQ_INT(parse_ids(o.out, got, N_GEN), N_GEN);
        while (agree < N_GEN && got[agree] == theirs[p][agree])
          agree++;
        printf("# llama.cpp's %s %s file, prompt %d, %s mode: %d of %d tokens as llama.cpp's\n",
               cases[ci].preset, cases[ci].name, p, mode ? "q8" : "default", agree, N_GEN);
        if (agree < N_GEN && !(gaps[p][agree] < NEAR_TIE))
          th_fail(__FILE__, __LINE__,
                  "%s %s prompt %d: token %d is %d, llama.cpp's %d (%.4f apart)", cases[ci].preset,
                  cases[ci].name, p, agree, got[agree], theirs[p][agree], gaps[p][agree]);
      }
  }
  th_out_free(&o);
}

/* --quantization q8_0|q4_0|q4_k runs as the GGUF file lmserve quantize writes
 * from the same checkpoint: the same greedy tokens on one rank and on two
 * (processes, all-reduced; the MLP's 768 columns cut as 384 and 384, or, in
 * Q4_K's blocks of 256, 512 and 256), and in the q8 mode; a GGUF file with the
 * flag is refused. (test-wk-blockq checks the logits and every rank's cuts, bit
 * for bit.) */
TH_TEST(quantization_at_load_runs_as_the_gguf_file) {
  th_proc_init(900);
  char model[300];
  tmp_path(model, "k256q");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma3", "--preset", "k256", "--seed", "5",
                "--intermediate-size", "768", "--out", model) == 0);
  static const char *types[] = {"q8_0", "q4_0", "q4_k"};
  const char *prompt = "[2,7000,7001,7002,8000,123,4567,10,11,12]";
  for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
    char q[300], name[32];
    snprintf(name, sizeof(name), "k256q-%s.gguf", types[ti]);
    tmp_path(q, name);
    TH_REQUIRE(lm(&o, "quantize", model, q, types[ti]) == 0);
    for (int tp = 1; tp <= 2; tp++)
      for (int q8 = 0; q8 <= (ti < 2); q8++) {
        char tps[16];
        snprintf(tps, sizeof(tps), "%d", tp);
        const char *dt = q8 ? "q8" : "auto";
        int a[N_GEN], b[N_GEN];
        int rc = lm(&o, "generate", "--model", model, "--quantization", types[ti], "--prompt-ids",
                    prompt, "--max-tokens", "12", "--kv-dtype", "f32", "--ignore-eos", "--threads",
                    "2", "--tensor-parallel-size", tps, "--dtype", dt);
        if (rc) fprintf(stderr, "%s, %d rank(s): %s\n", types[ti], tp, o.err ? o.err : "");
        TH_REQUIRE(rc == 0);
        TH_CHECK_EQ_INT(parse_ids(o.out, a, N_GEN), N_GEN);
        TH_REQUIRE(lm(&o, "generate", "--model", q, "--prompt-ids", prompt, "--max-tokens", "12",
                      "--kv-dtype", "f32", "--ignore-eos", "--threads", "2",
                      "--tensor-parallel-size", tps, "--dtype", dt) == 0);
        TH_CHECK_EQ_INT(parse_ids(o.out, b, N_GEN), N_GEN);
        if (memcmp(a, b, sizeof(a)))
          th_fail(__FILE__, __LINE__, "%s, %d rank(s), dtype %s: other tokens than the file's",
                  types[ti], tp, dt);
      }
    if (ti == 1) {
      TH_CHECK(lm(&o, "generate", "--model", q, "--quantization", "q4_0", "--prompt-ids", "[2]") !=
               0);
      TH_CHECK(strstr(o.err, "GGUF") != NULL);
    }
  }
  TH_CHECK_EQ_INT(
      lm(&o, "generate", "--model", model, "--quantization", "q3_k", "--prompt-ids", "[2]"), 2);
  TH_CHECK(strstr(o.err, "q3_k") != NULL);
  th_out_free(&o);
}

/* A tiny Gemma 3 (make-tiny-model --arch gemma3 --seed SEED) in the test's folder as
 * `name`, its path in model[300]; skips the test when it has no tokenizer.json. */
static void tiny_gemma3_with_tokenizer(char *model, const char *name, const char *seed) {
  tmp_path(model, name);
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma3", "--seed", seed, "--out", model) == 0);
  th_out_free(&o);
  char tj[320];
  snprintf(tj, sizeof(tj), "%s/tokenizer.json", model);
  if (access(tj, R_OK)) TH_SKIP("the tiny model has no tokenizer.json (run tools/setup)");
}

/* `lmserve serve` runs a GGUF file alone (its tokenizer and chat template from the
 * metadata) and with the tokenizer of a folder (--tokenizer): the same greedy answers
 * either way, structured outputs included (the workers' vocabulary comes from the same
 * place as the frontend's). */
TH_TEST(serve_runs_a_gguf_file_with_a_tokenizer_folder) {
  th_proc_init(600);
  char model[300], q[300];
  tiny_gemma3_with_tokenizer(model, "s3", "3");
  tmp_path(q, "s3-q8_0.gguf");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "quantize", model, q, "q8_0") == 0);
  /* a request and what its answer holds (either text, when two) */
  static const struct {
    const char *path, *body, *says[2];
  } reqs[3] = {
      {"/v1/completions",
       "{\"prompt\":\"hello there\",\"max_tokens\":6,\"temperature\":0}",
       {"\"completion_tokens\":6", NULL}},
      {"/v1/chat/completions",
       "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
       "\"max_tokens\":4,\"temperature\":0}",
       {"chat.completion", NULL}},
      {"/v1/completions",
       "{\"prompt\":\"yes or no?\",\"max_tokens\":8,\"temperature\":0,"
       "\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]}}",
       {"\"text\":\"yes\"", "\"text\":\"no\""}},
  };
  char *answers[2][3] = {{NULL, NULL, NULL}, {NULL, NULL, NULL}};
  for (int alone = 0; alone < 2; alone++) {
    struct th_proc p;
    char *extra[] = {"--tokenizer", model, NULL};
    int port = th_serve_start(&p, q, alone ? NULL : extra);
    TH_REQUIRE(port > 0);
    for (int k = 0; k < 3; k++) {
      char **a = &answers[alone][k];
      TH_CHECK_EQ_INT(th_http(port, "POST", reqs[k].path, reqs[k].body, 60000, a), 200);
      TH_CHECK(*a &&
               (strstr(*a, reqs[k].says[0]) || (reqs[k].says[1] && strstr(*a, reqs[k].says[1]))));
    }
    th_proc_stop(&p, 20000);
  }
  /* the answers' text and token counts agree (ids and times do not) */
  for (int k = 0; k < 3; k++) {
    const char *a = answers[0][k] ? strstr(answers[0][k], "\"choices\"") : NULL;
    const char *b = answers[1][k] ? strstr(answers[1][k], "\"choices\"") : NULL;
    TH_CHECK(a && b && !strcmp(a, b));
    free(answers[0][k]);
    free(answers[1][k]);
  }
  th_out_free(&o);
}

/* ids[] without spaces, and without a leading bos (2,) when drop_bos. */
static void squeeze_ids(char *ids, int drop_bos) {
  char *w = ids;
  for (const char *r = ids; *r; r++)
    if (*r != ' ' && *r != '\n') *w++ = *r;
  *w = 0;
  if (drop_bos && !strncmp(ids, "[2,", 3))
    memmove(ids + 1, ids + 3, strlen(ids + 3) + 1);
  else if (drop_bos && !strcmp(ids, "[2]"))
    strcpy(ids, "[]");
}

/* For every file of the tokenizer corpus (less the lines naming tokens past the
 * model's vocabulary: <image_soft_token> has no embedding row, so it is not in
 * the file): `lmserve tokenize` gives the same ids from the GGUF file g as from
 * the checkpoint folder's tokenizer.json; and, with llamacpp (its folder), the
 * same as llama.cpp's own reading of g (which adds no bos here). */
static void same_ids_on_the_corpus(const char *model, const char *g, const char *llamacpp) {
  char dir[1100];
  snprintf(dir, sizeof(dir), "%s/fixtures/tokenizer/corpus", th_tests_dir());
  DIR *d = opendir(dir);
  TH_REQUIRE(d != NULL);
  struct dirent *e;
  int files = 0, lines = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[1400];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    TH_REQUIRE(f != NULL);
    char *line = NULL, *text = NULL;
    size_t cap = 0, tlen = 0;
    ssize_t n;
    FILE *mem = open_memstream(&text, &tlen);
    TH_REQUIRE(mem != NULL);
    while ((n = getline(&line, &cap, f)) > 0) /* the file less those lines, as one text */
      if (!strstr(line, "<image_soft_token>")) {
        fwrite(line, 1, (size_t)n, mem);
        lines++;
      }
    fclose(mem);
    free(line);
    fclose(f);
    char *ids[3] = {NULL, NULL, NULL}, script[1100];
    snprintf(script, sizeof(script), "%s/integration/gguf-llamacpp.mjs", th_tests_dir());
    for (int k = 0; k < (llamacpp ? 3 : 2); k++) {
      char *argv[] = {th_lmserve_bin(), "tokenize", "--tokenizer", k ? (char *)g : (char *)model,
                      NULL};
      char *largv[] = {"node", script, (char *)llamacpp, (char *)g, "tokenize", NULL};
      char *err = NULL;
      int rc = th_run(k < 2 ? argv : largv, NULL, text, tlen, 120000, &ids[k], &err);
      if (rc) fprintf(stderr, "%s\n", err ? err : "");
      TH_CHECK_EQ_INT(rc, 0);
      free(err);
    }
    if (!ids[0] || !ids[1] || strcmp(ids[0], ids[1]))
      th_fail(__FILE__, __LINE__, "%s: %.200s against %.200s", e->d_name,
              ids[1] ? ids[1] : "(none)", ids[0] ? ids[0] : "(none)");
    if (llamacpp && ids[1] && ids[2]) {
      squeeze_ids(ids[1], 1);
      squeeze_ids(ids[2], 0);
      if (strcmp(ids[1], ids[2]))
        th_fail(__FILE__, __LINE__, "%s: llama.cpp %.200s against %.200s", e->d_name, ids[2],
                ids[1]);
    }
    for (int k = 0; k < 3; k++)
      free(ids[k]);
    free(text);
    files++;
  }
  closedir(d);
  printf("# %d lines of %d corpus files: the same ids%s\n", lines, files,
         llamacpp ? ", llama.cpp's too" : "");
  TH_CHECK(lines >= 30);
}

/* The tokenizer read from a GGUF file's metadata (the vocabulary export-gguf writes,
 * as llama.cpp's converter does: tokens, scores, token types) gives tokenizer.json's
 * ids for every line of the tokenizer corpus. */
TH_TEST(gguf_tokenizer_gives_the_tokenizer_json_ids) {
  th_proc_init(600);
  char model[300], g[300];
  tiny_gemma3_with_tokenizer(model, "t3", "1");
  tmp_path(g, "t3.gguf");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", g) == 0);
  same_ids_on_the_corpus(model, g, NULL);
  th_out_free(&o);
}

/* Gemma 4's vocabulary as llama.cpp's converter writes it (tokenizer.ggml.model
 * "gemma4": tokenizer.json's merges in tokenizer.ggml.merges): read from the
 * file, tokenizer.json's ids on the corpus, and llama.cpp's own ids from the
 * same file (where node-llama-cpp is installed; said loudly where not). */
TH_TEST(gguf_gemma4_vocabulary_gives_the_tokenizer_json_and_llamacpp_ids) {
  th_proc_init(900);
  char model[300], g[300], dir[1024];
  tmp_path(model, "t4");
  tmp_path(g, "t4.gguf");
  struct th_out o = {0};
  TH_REQUIRE(
      lm(&o, "make-tiny-model", "--arch", "gemma4", "--preset", "tiny-dense", "--out", model) == 0);
  TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", g) == 0);
  const char *why = llamacpp_dir(dir);
  if (why) printf("# %s\n", why);
  same_ids_on_the_corpus(model, g, why ? NULL : dir);
  th_out_free(&o);
}

/* `lmserve generate` takes a GGUF model as the other roles do: the file, or a
 * folder holding it, with the tokenizer of its metadata (or --tokenizer's), so a
 * prompt in text gives what the tokenizer.json ids give; a file that is not GGUF
 * is named as such, whatever the prompt, and serve names it before starting. */
TH_TEST(generate_runs_a_gguf_file_or_folder_with_its_own_tokenizer) {
  th_proc_init(300);
  char model[300], dir[300], g[320];
  tiny_gemma3_with_tokenizer(model, "gen3", "5");
  tmp_path(dir, "gen3-gguf");
  TH_REQUIRE(mkdir(dir, 0755) == 0);
  snprintf(g, sizeof(g), "%s/model.gguf", dir);
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", g) == 0);
  const char *text = "The capital of France is";
  /* the reference: the prompt through tokenizer.json */
  TH_REQUIRE(lm(&o, "generate", "--model", g, "--tokenizer", model, "--prompt", text,
                "--max-tokens", "6") == 0);
  char *first = strdup(o.out);
  TH_CHECK(strchr(first, '\n') && strchr(first, '\n')[1] != '\n'); /* the text decoded */
  const char *runs[] = {g, dir};
  for (int r = 0; r < 2; r++) {
    int rc = lm(&o, "generate", "--model", runs[r], "--prompt", text, "--max-tokens", "6");
    if (rc) fprintf(stderr, "%s\n", o.err);
    TH_CHECK_EQ_INT(rc, 0);
    if (strcmp(o.out, first))
      th_fail(__FILE__, __LINE__, "--model %s --prompt: %.200s, not tokenizer.json's %.200s",
              runs[r], o.out, first);
  }
  /* ids alone: the text still decoded by the file's vocabulary */
  TH_REQUIRE(lm(&o, "generate", "--model", g, "--prompt-ids", "2,100,200", "--max-tokens", "4") ==
             0);
  TH_CHECK(strchr(o.out, '\n') && strchr(o.out, '\n')[1] != '\n');
  char notgguf[320];
  snprintf(notgguf, sizeof(notgguf), "%s/config.json", model);
  TH_CHECK_EQ_INT(lm(&o, "generate", "--model", notgguf, "--prompt", text), 2);
  TH_CHECK(strstr(o.err, "not a GGUF file") != NULL);
  /* serve says it before it starts a process */
  TH_CHECK_EQ_INT(lm(&o, "serve", "--model", notgguf, "--port", "1"), 2);
  TH_CHECK(strstr(o.err, "not a GGUF file") != NULL);
  free(first);
  th_out_free(&o);
}

/* The first byte at which files a and b differ (one ending first counts), or -1. */
static long first_difference(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  TH_REQUIRE(fa && fb);
  long at = 0;
  for (;; at++) {
    int ca = getc(fa), cb = getc(fb);
    if (ca != cb) break;
    if (ca == EOF) {
      at = -1;
      break;
    }
  }
  fclose(fa);
  fclose(fb);
  return at;
}

/* lmserve quantize takes a GGUF input as llama.cpp's quantizer does: the matrices
 * of a 16-bit file into the type asked, its metadata kept. Gemma 3's norms stay
 * as the file holds them (1 + w, not shifted again) and the vocabulary stays
 * in the file, so the output is the one quantize writes from the checkpoint
 * folder, to the byte, and runs a text prompt by itself. */
TH_TEST(quantize_takes_a_gguf_input_as_llamacpps_quantizer_does) {
  th_proc_init(300);
  char model[300], g[300], from_gguf[300], from_dir[300];
  tiny_gemma3_with_tokenizer(model, "rq3", "7");
  tmp_path(g, "rq3.gguf");
  tmp_path(from_gguf, "rq3-from-gguf.gguf");
  tmp_path(from_dir, "rq3-from-dir.gguf");
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", g) == 0);
  const char *types[] = {"q4_0", "q6_k"};
  for (int t = 0; t < 2; t++) {
    TH_REQUIRE(lm(&o, "quantize", g, from_gguf, types[t]) == 0);
    TH_REQUIRE(lm(&o, "quantize", model, from_dir, types[t]) == 0);
    long at = first_difference(from_gguf, from_dir);
    if (at >= 0)
      th_fail(__FILE__, __LINE__,
              "%s: quantize from the GGUF file differs from the folder's at "
              "byte %ld",
              types[t], at);
    int rc = lm(&o, "generate", "--model", from_gguf, "--prompt", "hello", "--max-tokens", "2");
    if (rc) fprintf(stderr, "%s\n", o.err);
    TH_CHECK_EQ_INT(rc, 0);
  }
  /* a file already in blocks is refused naming a tensor and its type */
  TH_CHECK_EQ_INT(lm(&o, "quantize", from_gguf, from_dir, "q8_0"), 1);
  TH_CHECK(strstr(o.err, ".weight: dtype q") != NULL && strstr(o.err, "unquantized") != NULL);
  th_out_free(&o);
}

/* The number after "wrote ...: ..., " and before " tensors" in a quantize or
 * export-gguf report. */
static int tensors_written(const char *out) {
  const char *t = strstr(out, " tensors");
  TH_REQUIRE(t != NULL);
  while (t > out && t[-1] >= '0' && t[-1] <= '9')
    t--;
  return atoi(t);
}

/* Part k (from 1) of count of the split file named prefix.gguf in the test folder. */
static void part_path(char *path, const char *prefix, int k, int count) {
  char name[128];
  snprintf(name, sizeof(name), "%s-%05d-of-%05d.gguf", prefix, k, count);
  tmp_path(path, name);
}

/* Copies file a to b. */
static void copy_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "wb");
  TH_REQUIRE(fa && fb);
  char buf[65536];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), fa)) > 0;)
    TH_REQUIRE(fwrite(buf, 1, n, fb) == n);
  fclose(fa);
  TH_REQUIRE(fclose(fb) == 0);
}

/* A model split in parts (quantize and export-gguf --split-max-tensors /
 * --split-max-size, named as llama.cpp's gguf-split names them) loads as the
 * one file does: the same greedy tokens from its first part or its folder,
 * llama.cpp's own tokens from the same parts, and quantize reads a split
 * 16-bit file into the bytes the folder gives. A later part, a missing part,
 * a part of another split, a first part renamed and a wrong tensor count are
 * each refused naming the file; bad split flags are usage errors. */
TH_TEST(split_gguf_files_load_as_one_file) {
  th_proc_init(600);
  char model[300], one[300], dir[300], sp[400], p1[400], last[400];
  tiny_gemma3_with_tokenizer(model, "sp3", "5");
  tmp_path(one, "sp3-q8_0.gguf");
  tmp_path(dir, "sp3-parts");
  TH_REQUIRE(mkdir(dir, 0755) == 0);
  snprintf(sp, sizeof(sp), "%s/sp.gguf", dir);
  struct th_out o = {0};
  TH_REQUIRE(lm(&o, "quantize", model, one, "q8_0") == 0);
  const int nt = tensors_written(o.out), per = 7, count = (nt + per - 1) / per;
  TH_REQUIRE(count >= 3);
  TH_REQUIRE(lm(&o, "quantize", model, sp, "q8_0", "--split-max-tensors", "7") == 0);
  char said[64];
  snprintf(said, sizeof(said), "in %d parts", count);
  TH_CHECK(strstr(o.out, said) != NULL);
  TH_CHECK(access(sp, F_OK) != 0); /* only the parts */
  snprintf(p1, sizeof(p1), "%s/sp-00001-of-%05d.gguf", dir, count);
  snprintf(last, sizeof(last), "%s/sp-%05d-of-%05d.gguf", dir, count, count);
  TH_REQUIRE(access(p1, F_OK) == 0 && access(last, F_OK) == 0);

  static const char *prompt = "[2,651,1234,99,5000]";
  int ref[N_GEN], got[N_GEN];
  lmserve_generate(&o, one, prompt, ref);
  lmserve_generate(&o, p1, prompt, got);
  TH_CHECK(!memcmp(ref, got, sizeof(ref)));
  lmserve_generate(&o, dir, prompt, got); /* the folder of the parts */
  TH_CHECK(!memcmp(ref, got, sizeof(ref)));
  /* the vocabulary and template of the first part: text in, text out */
  TH_CHECK_EQ_INT(lm(&o, "generate", "--model", p1, "--prompt", "hello", "--max-tokens", "2"), 0);
  char lc[1024];
  if (!llamacpp_dir(lc)) { /* llama.cpp reads the parts as a split model of its own */
    int theirs[1][N_GEN];
    char all[64];
    snprintf(all, sizeof(all), "[%s]", prompt);
    llamacpp_generate(lc, p1, all, 1, theirs);
    int agree = 0;
    while (agree < N_GEN && theirs[0][agree] == got[agree])
      agree++;
    TH_CHECK_EQ_INT(agree, N_GEN);
  } else {
    printf("# llama.cpp is not here: the parts checked against lmserve's one file only\n");
  }

  /* quantize reads a split 16-bit file as it reads the folder */
  char sp16[400], from_parts[300], from_dir[300], p16[400];
  snprintf(sp16, sizeof(sp16), "%s/bf.gguf", dir);
  tmp_path(from_parts, "sp3-from-parts.gguf");
  tmp_path(from_dir, "sp3-from-dir.gguf");
  TH_REQUIRE(lm(&o, "export-gguf", "--model", model, "--out", sp16, "--split-max-size", "20K") ==
             0);
  const char *in = strstr(o.out, " in ");
  TH_REQUIRE(in != NULL);
  const int n16 = atoi(in + 4);
  TH_REQUIRE(n16 >= 2);
  snprintf(p16, sizeof(p16), "%s/bf-00001-of-%05d.gguf", dir, n16);
  TH_REQUIRE(lm(&o, "quantize", p16, from_parts, "q4_0") == 0);
  TH_REQUIRE(lm(&o, "quantize", model, from_dir, "q4_0") == 0);
  TH_CHECK_EQ_INT(first_difference(from_parts, from_dir), -1);

  /* a later part is not a model */
  char p2[400];
  snprintf(p2, sizeof(p2), "%s/sp-00002-of-%05d.gguf", dir, count);
  TH_CHECK(lm(&o, "generate", "--model", p2, "--prompt-ids", prompt) != 0);
  TH_CHECK(strstr(o.err, "later part of a split model") != NULL);
  /* the first part under another name: its other parts cannot be found */
  char renamed[300];
  tmp_path(renamed, "sp3-renamed.gguf");
  copy_file(p1, renamed);
  TH_CHECK(lm(&o, "generate", "--model", renamed, "--prompt-ids", prompt) != 0);
  TH_CHECK(strstr(o.err, "cannot be found") != NULL);
  /* a part missing */
  char moved[420];
  snprintf(moved, sizeof(moved), "%s.away", last);
  TH_REQUIRE(rename(last, moved) == 0);
  TH_CHECK(lm(&o, "generate", "--model", p1, "--prompt-ids", prompt) != 0);
  snprintf(said, sizeof(said), "part %d of %d", count, count);
  TH_CHECK(strstr(o.err, said) != NULL);
  /* a part of another split in its place */
  char other[300], op[300];
  tmp_path(other, "other.gguf");
  TH_REQUIRE(lm(&o, "quantize", model, other, "q8_0", "--split-max-tensors", "2") == 0);
  const int oc = (nt + 1) / 2;
  part_path(op, "other", count, oc);
  copy_file(op, last);
  TH_CHECK(lm(&o, "generate", "--model", p1, "--prompt-ids", prompt) != 0);
  TH_CHECK(strstr(o.err, "split.no and split.count say") != NULL);
  TH_REQUIRE(rename(moved, last) == 0);
  /* the first part's count of all tensors one too many */
  FILE *f = fopen(p1, "r+b");
  TH_REQUIRE(f != NULL);
  struct stat fs;
  TH_REQUIRE(stat(p1, &fs) == 0);
  char *head = malloc((size_t)fs.st_size);
  TH_REQUIRE(head != NULL);
  size_t hn = fread(head, 1, (size_t)fs.st_size, f);
  const char *key = memmem(head, hn, "split.tensors.count", 19);
  TH_REQUIRE(key != NULL);
  long at = (long)(key - head) + 19 + 4; /* past the key and its type */
  int32_t v;
  memcpy(&v, head + at, 4);
  TH_CHECK_EQ_INT(v, nt);
  v++;
  free(head);
  TH_REQUIRE(fseek(f, at, SEEK_SET) == 0 && fwrite(&v, 4, 1, f) == 1 && fclose(f) == 0);
  TH_CHECK(lm(&o, "generate", "--model", p1, "--prompt-ids", prompt) != 0);
  TH_CHECK(strstr(o.err, "split.tensors.count") != NULL);

  /* usage errors */
  TH_CHECK_EQ_INT(lm(&o, "quantize", model, sp, "q8_0", "--split-max-size", "2X"), 2);
  TH_CHECK(strstr(o.err, "--split-max-size") != NULL);
  TH_CHECK_EQ_INT(lm(&o, "quantize", model, sp, "q8_0", "--split-max-tensors", "0"), 2);
  TH_CHECK(strstr(o.err, "--split-max-tensors") != NULL);
  char noext[300];
  tmp_path(noext, "sp3-noext");
  TH_CHECK_EQ_INT(
      lm(&o, "export-gguf", "--model", model, "--out", noext, "--split-max-tensors", "7"), 1);
  TH_CHECK(strstr(o.err, "must end in .gguf") != NULL);
  th_out_free(&o);
}

TH_TEST(export_gguf_refuses_bad_input_clearly) {
  th_proc_init(300);
  char g4[300], out[300], nodir[300];
  tmp_path(g4, "g4");
  tmp_path(out, "x.gguf");
  tmp_path(nodir, "missing/x.gguf");
  struct th_out o = {0};
  /* the tiny preset's last storing layers are full then sliding: llama.cpp's gemma4 would
     let its KV-shared layers read other layers */
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma4", "--out", g4) == 0);
  TH_CHECK_EQ_INT(lm(&o, "export-gguf", "--model", g4, "--out", out), 1);
  TH_CHECK(strstr(o.err, "KV-shared layers: llama.cpp's gemma4") != NULL);
  TH_CHECK(access(out, F_OK) != 0);
  TH_CHECK_EQ_INT(lm(&o, "export-gguf", "--model", g4), 2);
  TH_CHECK(strstr(o.err, "--out") != NULL);
  TH_CHECK_EQ_INT(lm(&o, "export-gguf", "--model", g4, "--out", out, "--dtype", "q4"), 2);
  TH_CHECK(strstr(o.err, "--dtype") != NULL);
  TH_CHECK_EQ_INT(lm(&o, "export-gguf", "--model", "/nonexistent/model", "--out", out), 1);
  TH_CHECK(strstr(o.err, "/nonexistent/model") != NULL);

  char g3[300];
  tmp_path(g3, "g3b");
  TH_REQUIRE(lm(&o, "make-tiny-model", "--arch", "gemma3", "--out", g3) == 0);
  TH_CHECK_EQ_INT(lm(&o, "export-gguf", "--model", g3, "--out", nodir), 1);
  TH_CHECK(strstr(o.err, "cannot create") != NULL);
  th_out_free(&o);
}
