/* test-wk-lora.c — LoRA adapters through the forward pass (CPU backend, f32
 * weights and KV cache):
 *   - every position's logits of a Gemma 3 prompt with each of two adapters (all
 *     seven projections in f32; three projections of two layers in bf16 with
 *     rsLoRA's scale) against tests/reference/gemma3_mm_ref.py --lora, an
 *     independent numpy implementation of PEFT's LoraLayer (skipped, loudly,
 *     without python3 or numpy); the adapters move the logits far more than the
 *     tolerance, and the base model's stay the reference's without one;
 *   - one batch of three sequences (adapter 1, none, adapter 2) gives each the
 *     bits it gets alone, and a prompt run in chunks the bits of one run;
 *   - Gemma 4 (KV-shared layers, k_eq_v full layers, per-layer embeddings): the
 *     adapter against the checkpoint with the adapter merged into its weights
 *     (tests/reference/merge_lora.py, W + scale B A in float64);
 *   - an adapter that does not fit the model is refused naming the tensor, and the
 *     model goes on without it;
 *   - a PEFT adapter and its GGUF file as llama.cpp's converter writes it
 *     (tests/reference/lora_to_gguf.py), both loaded into one model, give the same
 *     logits bits (f32, and an f16 folder with its f16 file). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "proto/pr-msg.h"
#include "tests/unit/worker/wk-test-util.h"

#define LOGIT_TOL 1e-5 /* of the reference's logit range (f32 against float64) */
/* Against the merged checkpoint, whose weights W + scale B A are rounded to f32: that
 * rounding alone moves this tiny Gemma 4's logits by 1.7e-5 of their range (measured
 * with an adapter of B ~ 1e-7, whose own effect is 3e-5); any one adapted projection
 * left out moves them by more than 0.5. */
#define MERGED_TOL 1e-4
#define MAX_T      64

struct fx {
  char dir[4096];
  const char *python;
  struct kn_backend *be;
  struct wk_model *m;
  struct wk_page_alloc pa;
  const struct wk_kv_spec *kv;
  int V;
};

/* tests/reference/SCRIPT ARGS... (NULL-terminated), which must exit 0. */
static void py(struct fx *f, const char *script, char *const *args) {
  th_reference_at(__FILE__, __LINE__, f->python, script, args);
}

/* An adapter for the model in f->dir, made by make_lora.py with args, in dir/name. */
static void make_adapter(struct fx *f, const char *name, char *path, size_t n, char *const *args) {
  snprintf(path, n, "%s/%s", f->dir, name);
  char *argv[24] = {f->dir, path};
  int k = 2;
  while (args && args[k - 2] && k < 23) {
    argv[k] = args[k - 2];
    k++;
  }
  argv[k] = NULL;
  py(f, "make_lora.py", argv);
}

static void load(struct fx *f, const char *dir, int max_seqs) {
  char err[512] = "";
  struct wk_model_opts mo = {
      .max_batch_tokens = MAX_T * 3, .max_seqs = max_seqs, .kv_tokens = 2048, .quiet = 1};
  if (wk_model_load(dir, f->be, &mo, &f->m, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "model: %s", err);
    th_stop();
  }
  f->kv = wk_model_kv_spec(f->m);
  TH_REQUIRE(f->kv->dtype == KN_DTYPE_F32);
  TH_REQUIRE(wk_page_alloc_init(&f->pa, wk_model_n_pages(f->m)) == 0);
  f->V = wk_model_config(f->m)->vocab;
}

static void setup(struct fx *f, const char *arch) {
  memset(f, 0, sizeof(*f));
  f->python = th_require_numpy("LoRA adapters' logits", "gemma3_mm_ref.py");
  struct tl_tiny_opts o = {.arch = arch, .preset = "tiny", .vocab = 512};
  wkt_make_tiny(f->dir, sizeof(f->dir), &o, 7, MD_ST_F32);
  f->be = wkt_cpu_backend(2);
  load(f, f->dir, 4);
}

static void unload(struct fx *f) {
  wk_page_alloc_free(&f->pa);
  wk_model_free(f->m);
  f->m = NULL;
}

static void teardown(struct fx *f) {
  unload(f);
  kn_backend_destroy(f->be);
  cm_rmtree(f->dir);
}

static void add_lora(struct fx *f, const char *name, const char *path) {
  char err[768] = "";
  if (wk_model_add_lora(f->m, name, path, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "adapter %s: %s", name, err);
    th_stop();
  }
}

static void prompt(int32_t *ids, int n, int V, uint32_t seed) {
  ids[0] = 2;
  for (int i = 1; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    ids[i] = (int32_t)(5 + (seed >> 8) % (uint32_t)(V - 8));
  }
}

/* A sequence of one run over fresh blocks. */
struct seq {
  const int32_t *ids;
  int n, lora;
  struct wk_seq_blocks blk;
};

static void seq_init(struct fx *f, struct seq *s, const int32_t *ids, int n, int lora) {
  s->ids = ids;
  s->n = n;
  s->lora = lora;
  memset(&s->blk, 0, sizeof(s->blk));
  TH_REQUIRE(wk_seq_blocks_reserve(&s->blk, f->kv, &f->pa, n) == 0);
}

static struct wk_seq_input seq_input(struct fx *f, struct seq *s, int p0, int n) {
  struct wk_seq_input in = {
      .tokens = s->ids + p0, .n_tokens = n, .pos0 = p0, .n_out = n, .lora = s->lora};
  wkt_seq_pages(&in, f->kv, &s->blk);
  return in;
}

/* One forward of seqs (each from p0[i], n[i] tokens), every token's logits into out. */
static void forward(struct fx *f, struct seq **seqs, const int *p0, const int *n, int k,
                    float *out) {
  struct wk_seq_input in[4];
  for (int i = 0; i < k; i++)
    in[i] = seq_input(f, seqs[i], p0[i], n[i]);
  struct wk_batch b = {.seqs = in, .n_seqs = k, .logits = out};
  char err[512] = "";
  if (wk_model_forward(f->m, &b, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "forward: %s", err);
    th_stop();
  }
}

/* The whole prompt alone with adapter lora: [n, V] logits (malloc'd). */
static float *run_alone(struct fx *f, const int32_t *ids, int n, int lora) {
  float *out = malloc(sizeof(float) * (size_t)n * f->V);
  TH_REQUIRE(out);
  struct seq s;
  seq_init(f, &s, ids, n, lora);
  struct seq *ss[1] = {&s};
  int p0 = 0;
  forward(f, ss, &p0, &n, 1, out);
  wk_seq_blocks_release(&s.blk, f->kv, &f->pa);
  return out;
}

/* gemma3_mm_ref.py's logits for ids[0, n), with the adapter in lora_dir (NULL: none). */
static float *run_reference(struct fx *f, const int32_t *ids, int n, const char *lora_dir) {
  char ids_path[4200], out_path[4200];
  snprintf(ids_path, sizeof(ids_path), "%s/ids.i32", f->dir);
  snprintf(out_path, sizeof(out_path), "%s/reference.f32", f->dir);
  TH_REQUIRE(wkt_write_file(ids_path, ids, (size_t)n * sizeof(int32_t)) == 0);
  char *argv[] = {f->dir,           ids_path, ids_path, "0", out_path, lora_dir ? "--lora" : NULL,
                  (char *)lora_dir, NULL};
  py(f, "gemma3_mm_ref.py", argv);
  float *want = malloc(sizeof(float) * (size_t)n * f->V);
  TH_REQUIRE(want && wkt_read_f32(out_path, want, (size_t)n * f->V) == 0);
  return want;
}

/* ---- tests ------------------------------------------------------------------------------- */

TH_TEST(lora_logits_vs_reference) {
  struct fx f;
  setup(&f, "gemma3");
  char a1[4200], a2[4200];
  make_adapter(&f, "all", a1, sizeof(a1),
               (char *[]){"--rank", "4", "--alpha", "16", "--std-b", "0.05", "--seed", "1", NULL});
  make_adapter(&f, "some", a2, sizeof(a2),
               (char *[]){"--rank", "8", "--alpha", "4", "--rslora", "--dtype", "bf16", "--targets",
                          "q_proj,v_proj,down_proj", "--layers", "0,1", "--std-b", "0.1", "--seed",
                          "2", NULL});
  add_lora(&f, "all", a1);
  add_lora(&f, "some", a2);
  TH_CHECK(wk_model_n_lora(f.m) == 2);
  int32_t ids[MAX_T];
  int T = 40;
  prompt(ids, T, f.V, 11);
  size_t n = (size_t)T * f.V;
  float *base = run_alone(&f, ids, T, 0);
  float *want0 = run_reference(&f, ids, T, NULL);
  double e0 = wkt_rel_err(base, want0, n);
  printf("base model vs reference: %.3g of the range\n", e0);
  TH_CHECK(e0 < LOGIT_TOL);
  const char *dirs[2] = {a1, a2};
  for (int l = 1; l <= 2; l++) {
    float *got = run_alone(&f, ids, T, l);
    float *want = run_reference(&f, ids, T, dirs[l - 1]);
    double e = wkt_rel_err(got, want, n), moved = wkt_rel_err(base, want, n);
    printf("adapter %d vs reference: %.3g of the range (the base model's logits: %.3g)\n", l, e,
           moved);
    TH_CHECK(e < LOGIT_TOL);
    TH_CHECK(moved > 100 * LOGIT_TOL); /* the adapter changes what a test can see */
    free(got);
    free(want);
  }
  free(base);
  free(want0);
  teardown(&f);
}

/* Adapters 1 ("one": rank 4, every projection) and 2 ("two": rank 16, four of them) of
 * f's model, their folders into a1 and a2 (4200 bytes each). */
static void two_adapters(struct fx *f, char *a1, char *a2) {
  make_adapter(f, "one", a1, 4200, (char *[]){"--rank", "4", "--seed", "3", NULL});
  make_adapter(f, "two", a2, 4200,
               (char *[]){"--rank", "16", "--targets", "k_proj,o_proj,gate_proj,up_proj", "--seed",
                          "4", NULL});
  add_lora(f, "one", a1);
  add_lora(f, "two", a2);
}

TH_TEST(lora_batch_bits) {
  struct fx f;
  setup(&f, "gemma3");
  char a1[4200], a2[4200];
  two_adapters(&f, a1, a2);
  int32_t p[3][MAX_T];
  int len[3] = {37, 21, 30}, lora[3] = {1, 0, 2};
  float *alone[3];
  for (int i = 0; i < 3; i++) {
    prompt(p[i], len[i], f.V, 100 + (uint32_t)i);
    alone[i] = run_alone(&f, p[i], len[i], lora[i]);
  }
  struct seq s[3];
  struct seq *ss[3] = {&s[0], &s[1], &s[2]};
  int p0[3] = {0, 0, 0};
  for (int i = 0; i < 3; i++)
    seq_init(&f, &s[i], p[i], len[i], lora[i]);
  float *out = malloc(sizeof(float) * (size_t)(len[0] + len[1] + len[2]) * f.V);
  TH_REQUIRE(out);
  forward(&f, ss, p0, len, 3, out);
  size_t at = 0;
  for (int i = 0; i < 3; i++) {
    TH_CHECK(memcmp(out + at, alone[i], sizeof(float) * (size_t)len[i] * f.V) == 0);
    at += (size_t)len[i] * f.V;
  }
  /* the first prompt in chunks of 16, 16 and 5 tokens */
  struct seq c;
  seq_init(&f, &c, p[0], len[0], 1);
  struct seq *cs[1] = {&c};
  for (int q0 = 0; q0 < len[0]; q0 += 16) {
    int k = len[0] - q0 < 16 ? len[0] - q0 : 16;
    forward(&f, cs, &q0, &k, 1, out + (size_t)q0 * f.V);
  }
  TH_CHECK(memcmp(out, alone[0], sizeof(float) * (size_t)len[0] * f.V) == 0);
  /* two sequences with the same adapter side by side: one run of rows */
  struct seq d[2];
  struct seq *ds[2] = {&d[0], &d[1]};
  int dl[2] = {len[0], len[0]}, d0[2] = {0, 0};
  seq_init(&f, &d[0], p[0], len[0], 1);
  seq_init(&f, &d[1], p[0], len[0], 1);
  forward(&f, ds, d0, dl, 2, out);
  TH_CHECK(memcmp(out, alone[0], sizeof(float) * (size_t)len[0] * f.V) == 0);
  TH_CHECK(memcmp(out + (size_t)len[0] * f.V, alone[0], sizeof(float) * (size_t)len[0] * f.V) == 0);
  free(out);
  for (int i = 0; i < 3; i++) {
    free(alone[i]);
    wk_seq_blocks_release(&s[i].blk, f.kv, &f.pa);
  }
  wk_seq_blocks_release(&c.blk, f.kv, &f.pa);
  for (int i = 0; i < 2; i++)
    wk_seq_blocks_release(&d[i].blk, f.kv, &f.pa);
  teardown(&f);
}

/* Run-time adapters (the scheduler's CTRL LORA_LOAD): an adapter set into a slot after
 * the list's gives the bits it gives as one of the list, beside the list's in one batch;
 * a slot set again runs its new adapter; a dropped slot is refused by the forward; a
 * bad folder or a rank above the cap leaves the slot empty and the model serving. */
TH_TEST(lora_run_time_slots) {
  struct fx f;
  setup(&f, "gemma3");
  char a1[4200], a2[4200];
  two_adapters(&f, a1, a2);
  int32_t p[MAX_T];
  const int len = 29;
  prompt(p, len, f.V, 7);
  float *want1 = run_alone(&f, p, len, 1), *want2 = run_alone(&f, p, len, 2);
  char err[1024] = "";
  TH_CHECK(!wk_model_has_lora(f.m, 5));
  TH_REQUIRE(wk_model_set_lora(f.m, 5, a2, 0, err, sizeof(err)) == 0);
  TH_CHECK(wk_model_has_lora(f.m, 5) && wk_model_n_lora(f.m) == 2);
  float *got = run_alone(&f, p, len, 5);
  TH_CHECK(memcmp(got, want2, sizeof(float) * (size_t)len * f.V) == 0);
  free(got);
  /* beside a list's adapter in one batch */
  struct seq s[2];
  struct seq *ss[2] = {&s[0], &s[1]};
  int p0[2] = {0, 0}, ls[2] = {len, len};
  seq_init(&f, &s[0], p, len, 1);
  seq_init(&f, &s[1], p, len, 5);
  float *out = malloc(sizeof(float) * 2 * (size_t)len * f.V);
  TH_REQUIRE(out);
  forward(&f, ss, p0, ls, 2, out);
  TH_CHECK(memcmp(out, want1, sizeof(float) * (size_t)len * f.V) == 0);
  TH_CHECK(memcmp(out + (size_t)len * f.V, want2, sizeof(float) * (size_t)len * f.V) == 0);
  free(out);
  for (int i = 0; i < 2; i++)
    wk_seq_blocks_release(&s[i].blk, f.kv, &f.pa);
  /* the slot set again: its new adapter, of another rank */
  TH_REQUIRE(wk_model_set_lora(f.m, 5, a1, 0, err, sizeof(err)) == 0);
  got = run_alone(&f, p, len, 5);
  TH_CHECK(memcmp(got, want1, sizeof(float) * (size_t)len * f.V) == 0);
  free(got);
  /* dropped: the forward refuses it; the list's slots are not run-time ones */
  wk_model_drop_lora(f.m, 5);
  TH_CHECK(!wk_model_has_lora(f.m, 5));
  struct seq d;
  seq_init(&f, &d, p, len, 5);
  struct wk_seq_input in = seq_input(&f, &d, 0, len);
  float *lg = malloc(sizeof(float) * (size_t)len * f.V);
  TH_REQUIRE(lg);
  struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = lg};
  TH_CHECK(wk_model_forward(f.m, &b, err, sizeof(err)) == CM_ERR_RANGE);
  free(lg);
  wk_seq_blocks_release(&d.blk, f.kv, &f.pa);
  TH_CHECK(wk_model_set_lora(f.m, 2, a1, 0, err, sizeof(err)) == CM_ERR_RANGE);
  TH_CHECK(wk_model_set_lora(f.m, PR_MAX_LORAS + 1, a1, 0, err, sizeof(err)) == CM_ERR_RANGE);
  /* refused: the slot stays empty, the model serves on */
  char missing[4300];
  snprintf(missing, sizeof(missing), "%s/nothing-here", f.dir);
  TH_CHECK(wk_model_set_lora(f.m, 6, missing, 0, err, sizeof(err)) < 0);
  TH_CHECK(strstr(err, "adapter_config.json") != NULL);
  TH_CHECK(!wk_model_has_lora(f.m, 6));
  TH_CHECK(wk_model_set_lora(f.m, 6, a2, 8, err, sizeof(err)) == CM_ERR_RANGE);
  TH_CHECK(strstr(err, "rank 16") != NULL && !wk_model_has_lora(f.m, 6));
  got = run_alone(&f, p, len, 2);
  TH_CHECK(memcmp(got, want2, sizeof(float) * (size_t)len * f.V) == 0);
  free(got);
  wk_model_drop_run_time_loras(f.m);
  free(want1);
  free(want2);
  teardown(&f);
}

TH_TEST(lora_gemma4_against_merged) {
  struct fx f;
  setup(&f, "gemma4");
  const struct md_config *c = wk_model_config(f.m);
  int shared = 0, keqv = 0;
  for (int l = 0; l < c->n_layers; l++) {
    shared += c->layers[l].kv_shared;
    keqv += c->layers[l].k_eq_v;
  }
  printf("gemma4 tiny: %d layers, %d KV-shared, %d with k_eq_v, per-layer inputs %d\n", c->n_layers,
         shared, keqv, c->ple_dim);
  char a[4200], merged[4200];
  make_adapter(&f, "g4", a, sizeof(a),
               (char *[]){"--rank", "4", "--std-b", "0.05", "--seed", "5", NULL});
  add_lora(&f, "g4", a);
  int32_t ids[MAX_T];
  int T = 33;
  prompt(ids, T, f.V, 21);
  float *base = run_alone(&f, ids, T, 0);
  float *got = run_alone(&f, ids, T, 1);
  /* the last rows only, with and without the adapter in one batch: the KV-shared
   * layers run those rows alone (fast prefill), the adapter's rows renumbered */
  struct seq s[2];
  seq_init(&f, &s[0], ids, T, 0);
  seq_init(&f, &s[1], ids, T, 1);
  struct wk_seq_input in[2] = {seq_input(&f, &s[0], 0, T), seq_input(&f, &s[1], 0, T)};
  in[0].n_out = in[1].n_out = 1;
  float *last = malloc(sizeof(float) * 2 * (size_t)f.V);
  struct wk_batch b = {.seqs = in, .n_seqs = 2, .logits = last};
  char err[512] = "";
  TH_REQUIRE(last && wk_model_forward(f.m, &b, err, sizeof(err)) == 0);
  TH_CHECK(memcmp(last, base + (size_t)(T - 1) * f.V, sizeof(float) * (size_t)f.V) == 0);
  TH_CHECK(memcmp(last + f.V, got + (size_t)(T - 1) * f.V, sizeof(float) * (size_t)f.V) == 0);
  free(last);
  for (int i = 0; i < 2; i++)
    wk_seq_blocks_release(&s[i].blk, f.kv, &f.pa);
  snprintf(merged, sizeof(merged), "%s/merged", f.dir);
  py(&f, "merge_lora.py", (char *[]){f.dir, a, merged, NULL});
  unload(&f);
  load(&f, merged, 4);
  float *want = run_alone(&f, ids, T, 0);
  size_t n = (size_t)T * f.V;
  double e = wkt_rel_err(got, want, n), moved = wkt_rel_err(base, want, n);
  printf("gemma4 adapter vs merged weights: %.3g of the range (the base model's: %.3g)\n", e,
         moved);
  TH_CHECK(e < MERGED_TOL);
  TH_CHECK(moved > 100 * MERGED_TOL);
  free(base);
  free(got);
  free(want);
  teardown(&f);
}

TH_TEST(lora_refused_model_goes_on) {
  struct fx f;
  setup(&f, "gemma3");
  char a[4200], err[768] = "";
  make_adapter(&f, "bad", a, sizeof(a),
               (char *[]){"--rank", "4", "--extra",
                          "base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight", NULL});
  TH_CHECK(wk_model_add_lora(f.m, "bad", a, err, sizeof(err)) != 0);
  printf("refused: %s\n", err);
  TH_CHECK(strstr(err, "lora_C") != NULL && strstr(err, "bad") != NULL);
  TH_CHECK(wk_model_n_lora(f.m) == 0);
  char missing[4200];
  snprintf(missing, sizeof(missing), "%s/nowhere", f.dir);
  TH_CHECK(wk_model_add_lora(f.m, "gone", missing, err, sizeof(err)) != 0);
  TH_CHECK(strstr(err, "adapter_config.json") != NULL);
  int32_t ids[8];
  prompt(ids, 8, f.V, 5);
  float *base = run_alone(&f, ids, 8, 0);
  free(base);
  /* a sequence naming an adapter the model does not have */
  struct seq s;
  seq_init(&f, &s, ids, 8, 1);
  struct wk_seq_input in = seq_input(&f, &s, 0, 8);
  float *out = malloc(sizeof(float) * 8 * (size_t)f.V);
  struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = out};
  TH_CHECK(wk_model_forward(f.m, &b, err, sizeof(err)) == CM_ERR_RANGE);
  TH_CHECK(strstr(err, "LoRA adapter 1") != NULL);
  free(out);
  wk_seq_blocks_release(&s.blk, f.kv, &f.pa);
  teardown(&f);
}

/* A GGUF adapter (llama.cpp's layout) runs as the PEFT folder it was converted from:
 * the same values reach the same kernels, so every logit keeps its bits. */
TH_TEST(lora_gguf_file_runs_as_its_peft_folder) {
  struct fx f;
  setup(&f, "gemma3");
  static const struct {
    const char *name, *gname, *dtype, *outtype;
  } kinds[] = {{"p32", "g32", "f32", "f32"}, {"p16", "g16", "f16", "f16"}};
  char peft[2][4200], gguf[2][4200];
  for (int k = 0; k < 2; k++) {
    make_adapter(&f, kinds[k].name, peft[k], sizeof(peft[k]),
                 (char *[]){"--rank", "4", "--alpha", "16", "--std-b", "0.05", "--dtype",
                            (char *)kinds[k].dtype, "--seed", "6", NULL});
    snprintf(gguf[k], sizeof(gguf[k]), "%s.gguf", peft[k]);
    py(&f, "lora_to_gguf.py",
       (char *[]){peft[k], gguf[k], "--arch", "gemma3", "--outtype", (char *)kinds[k].outtype,
                  NULL});
    add_lora(&f, kinds[k].name, peft[k]);  /* adapter 2k + 1 */
    add_lora(&f, kinds[k].gname, gguf[k]); /* adapter 2k + 2 */
  }
  TH_CHECK(wk_model_n_lora(f.m) == 4);
  int32_t ids[MAX_T];
  int T = 40;
  prompt(ids, T, f.V, 31);
  size_t n = (size_t)T * f.V;
  float *base = run_alone(&f, ids, T, 0);
  for (int k = 0; k < 2; k++) {
    float *p = run_alone(&f, ids, T, 2 * k + 1), *g = run_alone(&f, ids, T, 2 * k + 2);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
      diff += memcmp(&p[i], &g[i], sizeof(float)) != 0;
    double moved = wkt_rel_err(base, p, n);
    printf("%s: GGUF file against its PEFT folder: %zu of %zu logits differ; the adapter moves "
           "the base model's by %.3g of the range\n",
           kinds[k].name, diff, n, moved);
    TH_CHECK_EQ_INT(diff, 0);
    TH_CHECK(moved > 100 * LOGIT_TOL);
    free(p);
    free(g);
  }
  free(base);
  teardown(&f);
}
