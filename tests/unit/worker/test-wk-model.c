/* test-wk-model.c — the forward pass through the paged KV pool on the CPU
 * backend: bit-exact logits whether a prompt runs in one chunk, several or
 * token by token; batch invariance; sliding-window crossing; bad batches. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-safetensors.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-greedy.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"

#define NP 150 /* prompt tokens: crosses the tiny models' 64-token window twice */

struct fixture {
  char dir[256];
  struct kn_backend *be;
  struct wk_model *m;
  struct wk_page_alloc pa;
  int V;
};

/* wk_model_opts.step_graphs and graph_verify_tokens of the models setup_load makes */
static int g_step_graphs, g_verify_tokens;

/* bf16 for setup_load: the bf16 mode on the AMX table's kernels with the
 * tile instructions emulated (kn_cpu_backend_create_amx_emulated). */
#define BF16_AMX_EMULATED 2

/* The backend capped at isa, in the bf16 mode when bf16 is set
 * (kn_cpu_backend_create_mode); the weights left in the checkpoint's mapping
 * when mmap is set. */
static int setup_load(struct fixture *f, const char *arch, int moe, enum md_st_dtype dt,
                      enum kn_cpu_isa isa, int bf16, int mmap) {
  memset(f, 0, sizeof(*f));
  if (wkt_make_model(f->dir, sizeof(f->dir), arch, moe, 0, dt, 7)) return -1;
  if (bf16 == BF16_AMX_EMULATED ? kn_cpu_backend_create_amx_emulated(2, &f->be)
                                : kn_cpu_backend_create_mode(2, isa, bf16, &f->be))
    return -1;
  struct wk_model_opts o = {.max_batch_tokens = 256,
                            .max_seqs = 4,
                            .kv_tokens = 1024,
                            .quiet = 1,
                            .mmap_weights = mmap,
                            .step_graphs = g_step_graphs,
                            .graph_verify_tokens = g_verify_tokens};
  char err[256];
  if (wk_model_load(f->dir, f->be, &o, &f->m, err, sizeof(err))) {
    fprintf(stderr, "load: %s\n", err);
    return -1;
  }
  f->V = wk_model_config(f->m)->vocab;
  return wk_page_alloc_init(&f->pa, wk_model_n_pages(f->m));
}

static int setup_isa(struct fixture *f, const char *arch, int moe, enum md_st_dtype dt,
                     enum kn_cpu_isa isa, int bf16) {
  return setup_load(f, arch, moe, dt, isa, bf16, 0);
}

static int setup_mode(struct fixture *f, const char *arch, int moe, enum md_st_dtype dt, int bf16) {
  return setup_isa(f, arch, moe, dt, KN_CPU_ISA_BEST, bf16);
}

static int setup(struct fixture *f, const char *arch, int moe, enum md_st_dtype dt) {
  return setup_mode(f, arch, moe, dt, 0);
}

static void teardown(struct fixture *f) {
  wk_page_alloc_free(&f->pa);
  wk_model_free(f->m);
  kn_backend_destroy(f->be);
  wkt_rmdir(f->dir);
}

static void make_prompt(int32_t *p, int n, int V, uint32_t seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (int32_t)((seed >> 8) % (uint32_t)V);
  }
  p[0] = 2;
}

/* A sequence in progress: its tokens, blocks, and how far it has run. */
struct seq {
  const int32_t *tokens;
  int n, done;
  struct wk_seq_blocks blk;
  float *logits; /* [n, V] every position's logits */
  float *hidden; /* [n, hidden] every position's final-normed state, or NULL (not asked) */
};

/* in: the n tokens at s's next position (every row's logits out), reading
 * s's block tables. */
static void seq_input(struct wk_seq_input *in, const struct seq *s, const struct wk_kv_spec *kv,
                      const int32_t *tokens, int n) {
  memset(in, 0, sizeof(*in));
  in->tokens = tokens;
  in->n_tokens = n;
  in->pos0 = s->done;
  in->n_out = n;
  wkt_seq_pages(in, kv, &s->blk);
}

/* Runs batch b through f's model: 0, or the error code (its message printed). */
static int forward(struct fixture *f, const struct wk_batch *b) {
  char err[256];
  int rc = wk_model_forward(f->m, b, err, sizeof(err));
  if (rc) fprintf(stderr, "forward: %s\n", err);
  return rc;
}

/* Rows of padding (wk_seq_input.pad) that step() adds to fill a batch up to this
 * many sequences (0: none), reading sequence 0's first page. */
static int g_pad_to;

/* Runs one step in which every unfinished sequence runs its next `chunk`
 * tokens, all in one batch. */
static int step(struct fixture *f, struct seq *s, int ns, int chunk) {
  struct wk_seq_input in[4];
  int k = 0, rows = 0;
  static float out[256 * 512];
  const struct wk_kv_spec *kv = wk_model_kv_spec(f->m);
  int idx[4];
  for (int i = 0; i < ns; i++) {
    if (s[i].done == s[i].n) continue;
    int n = s[i].n - s[i].done < chunk ? s[i].n - s[i].done : chunk;
    if (wk_seq_blocks_reserve(&s[i].blk, kv, &f->pa, s[i].done + n)) return -1;
    seq_input(&in[k], &s[i], kv, s[i].tokens + s[i].done, n);
    idx[k++] = i;
  }
  static const int32_t pad_token = 0;
  int n_real = k;
  while (g_pad_to && k < g_pad_to && s[0].blk.n[0] > 0) {
    memset(&in[k], 0, sizeof(in[k]));
    in[k].tokens = &pad_token;
    in[k].n_tokens = 1;
    in[k].pad = 1;
    for (int g = 0; g < kv->n_groups; g++) {
      in[k].block_tables[g] = s[0].blk.table[g];
      in[k].n_blocks[g] = 1;
    }
    k++;
  }
  static float hid[256 * 512];
  int H = wk_model_config(f->m)->hidden;
  struct wk_batch b = {.seqs = in, .n_seqs = k, .logits = out, .hidden = s[0].hidden ? hid : NULL};
  int rc = forward(f, &b);
  if (rc) return rc;
  for (int j = 0; j < n_real; j++) {
    struct seq *q = &s[idx[j]];
    memcpy(q->logits + (size_t)q->done * f->V, out + (size_t)rows * f->V,
           sizeof(float) * (size_t)in[j].n_tokens * f->V);
    if (q->hidden)
      memcpy(q->hidden + (size_t)q->done * H, hid + (size_t)rows * H,
             sizeof(float) * (size_t)in[j].n_tokens * H);
    rows += in[j].n_tokens;
    q->done += in[j].n_tokens;
  }
  return 0;
}

static int run_all(struct fixture *f, struct seq *s, int ns, int chunk) {
  for (;;) {
    int left = 0;
    for (int i = 0; i < ns; i++)
      left |= s[i].done < s[i].n;
    if (!left) return 0;
    if (step(f, s, ns, chunk)) return -1;
  }
}

static void release(struct fixture *f, struct seq *s, int ns) {
  for (int i = 0; i < ns; i++) {
    wk_seq_blocks_release(&s[i].blk, wk_model_kv_spec(f->m), &f->pa);
    free(s[i].logits);
    free(s[i].hidden);
  }
}

static void check_chunking_and_batching(const char *arch, int moe, enum md_st_dtype dt, int bf16) {
  struct fixture f;
  TH_REQUIRE(setup_mode(&f, arch, moe, dt, bf16) == 0);
  int32_t pa[NP], pb[40], pc[90];
  make_prompt(pa, NP, f.V, 1);
  make_prompt(pb, 40, f.V, 2);
  make_prompt(pc, 90, f.V, 3);
  size_t bytes = sizeof(float) * (size_t)NP * f.V;
  int chunks[] = {NP, 7, 1, 64};
  float *ref = NULL;
  for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
    struct seq s = {.tokens = pa, .n = NP, .logits = calloc(1, bytes)};
    TH_REQUIRE(run_all(&f, &s, 1, chunks[c]) == 0);
    if (!ref) {
      ref = malloc(bytes);
      memcpy(ref, s.logits, bytes);
    } else if (memcmp(ref, s.logits, bytes)) {
      th_fail(__FILE__, __LINE__, "%s: chunk %d logits differ from one-shot", arch, chunks[c]);
    }
    release(&f, &s, 1);
  }
  /* the same sequence batched with two others, in 32-token steps */
  struct seq s3[3] = {
      {.tokens = pb, .n = 40, .logits = calloc(1, sizeof(float) * 40 * (size_t)f.V)},
      {.tokens = pa, .n = NP, .logits = calloc(1, bytes)},
      {.tokens = pc, .n = 90, .logits = calloc(1, sizeof(float) * 90 * (size_t)f.V)},
  };
  TH_REQUIRE(run_all(&f, s3, 3, 32) == 0);
  if (memcmp(ref, s3[1].logits, bytes))
    th_fail(__FILE__, __LINE__, "%s: batched logits differ from alone", arch);
  /* sane values: finite, not constant, distinct argmax across positions */
  int distinct = 0;
  const struct md_config *c = wk_model_config(f.m);
  for (int p = 0; p < NP; p++) {
    const float *row = ref + (size_t)p * f.V;
    for (int v = 0; v < f.V; v++) {
      TH_REQUIRE(isfinite(row[v]));
      if (c->final_softcap > 0) TH_REQUIRE(fabsf(row[v]) <= (float)c->final_softcap);
    }
    if (p && wk_argmax(row, f.V) != wk_argmax(row - f.V, f.V)) distinct++;
  }
  TH_CHECK(distinct > NP / 2);
  release(&f, s3, 3);
  TH_CHECK_EQ_INT(f.pa.n_free, f.pa.n_pages);
  free(ref);
  teardown(&f);
}

TH_TEST(gemma4_chunked_batched_bit_exact) {
  check_chunking_and_batching("gemma4", 0, MD_ST_BF16, 0);
}
TH_TEST(gemma4_moe_chunked_batched_bit_exact) {
  check_chunking_and_batching("gemma4", 1, MD_ST_F32, 0);
}
TH_TEST(gemma3_chunked_batched_bit_exact) {
  check_chunking_and_batching("gemma3", 0, MD_ST_BF16, 0);
}
/* The bf16 mode is batch invariant too (on whichever kernels this processor
 * runs it: AVX-512-BF16 dot products, or rounded inputs on the f32 ones). */
TH_TEST(gemma4_bf16_mode_chunked_batched_bit_exact) {
  check_chunking_and_batching("gemma4", 0, MD_ST_BF16, 1);
}
TH_TEST(gemma3_bf16_mode_chunked_batched_bit_exact) {
  check_chunking_and_batching("gemma3", 0, MD_ST_BF16, 1);
}
/* ... and on the AMX tiles, here emulated: the whole model, prompt chunks of
 * 1 to 150 tokens, batches of three. */
TH_TEST(gemma4_bf16_amx_emulated_chunked_batched_bit_exact) {
  check_chunking_and_batching("gemma4", 0, MD_ST_BF16, BF16_AMX_EMULATED);
}
TH_TEST(gemma3_bf16_amx_emulated_chunked_batched_bit_exact) {
  check_chunking_and_batching("gemma3", 0, MD_ST_BF16, BF16_AMX_EMULATED);
}

/* Where the weights live changes no bit: copied into the huge-page arena
 * (the default; each matrix on a 64-byte line inside it), or read from the
 * checkpoint's mapping (mmap_weights), for every dtype of checkpoint. */
static void check_weights_copied_or_mapped(const char *arch, int moe, enum md_st_dtype dt) {
  float *logits[2] = {NULL, NULL};
  size_t bytes = 0;
  for (int mapped = 0; mapped < 2; mapped++) {
    struct fixture f;
    TH_REQUIRE(setup_load(&f, arch, moe, dt, KN_CPU_ISA_BEST, 0, mapped) == 0);
    const struct wk_arena *a = &f.m->arena;
    const unsigned char *wq = f.m->layers[0].wq.p, *emb = f.m->embed.p;
    if (mapped) {
      TH_CHECK(a->mem.base == NULL);
    } else {
      const unsigned char *base = a->mem.base;
      TH_REQUIRE(base != NULL);
      TH_CHECK(((uintptr_t)base & (((uintptr_t)2 << 20) - 1)) == 0);
      TH_CHECK(a->used <= a->mem.len && a->n_todo == 0 && a->todo == NULL); /* copied */
      TH_CHECK(wq >= base && wq < base + a->used && ((uintptr_t)wq & 63) == 0);
      TH_CHECK(emb >= base && emb < base + a->used && ((uintptr_t)emb & 63) == 0);
    }
    int32_t p[NP];
    make_prompt(p, NP, f.V, 5);
    bytes = sizeof(float) * (size_t)NP * f.V;
    struct seq s = {.tokens = p, .n = NP, .logits = calloc(1, bytes)};
    TH_REQUIRE(run_all(&f, &s, 1, 32) == 0);
    logits[mapped] = malloc(bytes);
    memcpy(logits[mapped], s.logits, bytes);
    release(&f, &s, 1);
    teardown(&f);
  }
  if (memcmp(logits[0], logits[1], bytes))
    th_fail(__FILE__, __LINE__, "%s: logits differ between copied and mapped weights", arch);
  free(logits[0]);
  free(logits[1]);
}

TH_TEST(weights_copied_or_mapped_same_bits) {
  check_weights_copied_or_mapped("gemma3", 0, MD_ST_BF16);
  check_weights_copied_or_mapped("gemma4", 1, MD_ST_F32);
  check_weights_copied_or_mapped("gemma4", 0, MD_ST_F16);
}

/* How far logits y are from x over NP positions: the largest difference
 * relative to each position's spread of x, averaged (*mean) and at worst
 * (*worst); how many positions have x's best two further apart than twice
 * that difference (*decided), and in how many of them y has x's argmax
 * (*same). */
static void logits_distance(const float *x, const float *y, int V, double *mean, double *worst,
                            int *decided, int *same) {
  *mean = *worst = 0.0;
  *decided = *same = 0;
  for (int p = 0; p < NP; p++, x += V, y += V) {
    float lo = x[0], hi = x[0];
    double d = 0.0;
    for (int v = 0; v < V; v++) {
      lo = x[v] < lo ? x[v] : lo;
      hi = x[v] > hi ? x[v] : hi;
      d = fabs((double)x[v] - y[v]) > d ? fabs((double)x[v] - y[v]) : d;
    }
    double rel = d / ((double)hi - lo);
    *worst = rel > *worst ? rel : *worst;
    *mean += rel / NP;
    int top = wk_argmax(x, V);
    float second = -INFINITY;
    for (int v = 0; v < V; v++)
      if (v != top && x[v] > second) second = x[v];
    if (x[top] - second > 2.0 * d) {
      (*decided)++;
      *same += wk_argmax(y, V) == top;
    }
  }
}

/* The bf16 mode on this processor's best kernels, against the bf16 mode on
 * the reference kernels and against the default mode: near, the argmax kept
 * where the other's best two are clearly apart. Not bit-near even across
 * kernels: f32 sums in another order move a later layer's input by an ulp,
 * which can move its bf16 rounding by a bf16 ulp (2^-8). How near depends on
 * the random model: the tiny Gemma 4 amplifies the rounding through its
 * layers more than the tiny Gemma 3. */
static void check_bf16_mode_near(const char *arch, double near, int bf16) {
  struct fixture fd, fb, fr;
  TH_REQUIRE(setup_mode(&fd, arch, 0, MD_ST_BF16, 0) == 0);
  TH_REQUIRE(setup_mode(&fb, arch, 0, MD_ST_BF16, bf16) == 0);
  TH_REQUIRE(setup_isa(&fr, arch, 0, MD_ST_BF16, KN_CPU_ISA_REF, 1) == 0);
  int32_t pa[NP];
  make_prompt(pa, NP, fd.V, 4);
  size_t bytes = sizeof(float) * (size_t)NP * fd.V;
  struct seq a = {.tokens = pa, .n = NP, .logits = calloc(1, bytes)};
  struct seq b = {.tokens = pa, .n = NP, .logits = calloc(1, bytes)};
  struct seq r = {.tokens = pa, .n = NP, .logits = calloc(1, bytes)};
  TH_REQUIRE(run_all(&fd, &a, 1, 64) == 0 && run_all(&fb, &b, 1, 64) == 0);
  TH_REQUIRE(run_all(&fr, &r, 1, 64) == 0);
  double mean, worst, mean_r, worst_r;
  int decided, same, decided_r, same_r;
  logits_distance(r.logits, b.logits, fd.V, &mean_r, &worst_r, &decided_r, &same_r);
  logits_distance(a.logits, b.logits, fd.V, &mean, &worst, &decided, &same);
  if (getenv("KT_VERBOSE"))
    printf("%s bf16 mode (%s): from its reference kernels %.4f of the logits' spread on "
           "average, %.4f at worst; from the default mode %.4f, %.4f, argmax kept %d of %d\n",
           arch, kn_backend_name(fb.be), mean_r, worst_r, mean, worst, same, decided);
  if (!(mean_r < near))
    th_fail(__FILE__, __LINE__, "%s: bf16 mode off its reference kernels by %g", arch, mean_r);
  TH_CHECK_EQ_INT(same_r, decided_r);
  TH_CHECK(worst > 0.0); /* the modes differ */
  if (!(mean < near))
    th_fail(__FILE__, __LINE__, "%s: bf16 mode logits off by %.4f of their spread", arch, mean);
  TH_CHECK(decided > 0);
  TH_CHECK_EQ_INT(same, decided);
  release(&fd, &a, 1);
  release(&fb, &b, 1);
  release(&fr, &r, 1);
  teardown(&fd);
  teardown(&fb);
  teardown(&fr);
}
TH_TEST(gemma3_bf16_mode_near_default) {
  check_bf16_mode_near("gemma3", 0.02, 1);
}
TH_TEST(gemma4_bf16_mode_near_default) {
  check_bf16_mode_near("gemma4", 0.2, 1);
}
/* ... on the AMX table too (its tiles emulated): its own sums, as near */
TH_TEST(gemma3_bf16_amx_emulated_near_default) {
  check_bf16_mode_near("gemma3", 0.02, BF16_AMX_EMULATED);
}
TH_TEST(gemma4_bf16_amx_emulated_near_default) {
  check_bf16_mode_near("gemma4", 0.2, BF16_AMX_EMULATED);
}

/* Greedy continuations agree for every chunking, and the window matters:
 * a model whose only change is a wider window continues differently. */
TH_TEST(greedy_chunking_and_window) {
  struct fixture f;
  TH_REQUIRE(setup(&f, "gemma4", 0, MD_ST_BF16) == 0);
  int32_t p[NP], g1[24], g2[24];
  make_prompt(p, NP, f.V, 5);
  char err[256];
  int n1 = 0, n2 = 0;
  struct wk_greedy_opts o = {.chunk = 0, .max_new = 24};
  TH_REQUIRE(wk_greedy_generate(f.m, &f.pa, p, NP, &o, g1, &n1, err, sizeof(err)) == 0);
  o.chunk = 5;
  TH_REQUIRE(wk_greedy_generate(f.m, &f.pa, p, NP, &o, g2, &n2, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(n1, 24);
  TH_CHECK(n1 == n2 && !memcmp(g1, g2, sizeof(int32_t) * (size_t)n1));
  teardown(&f);

  char dir[256];
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), "gemma4", 0, 4096, MD_ST_BF16, 7) == 0);
  struct kn_backend *be = NULL;
  kn_cpu_backend_create(2, &be);
  struct wk_model *m = NULL;
  struct wk_model_opts mo = {.max_batch_tokens = 256, .max_seqs = 1, .kv_tokens = 512, .quiet = 1};
  TH_REQUIRE(wk_model_load(dir, be, &mo, &m, err, sizeof(err)) == 0);
  struct wk_page_alloc pa;
  wk_page_alloc_init(&pa, wk_model_n_pages(m));
  o.chunk = 0;
  TH_REQUIRE(wk_greedy_generate(m, &pa, p, NP, &o, g2, &n2, err, sizeof(err)) == 0);
  TH_CHECK(memcmp(g1, g2, sizeof(int32_t) * 24) != 0);
  /* a prompt shorter than both windows sees the same keys: same tokens */
  int32_t g3[8], g4[8];
  int n3, n4;
  o.max_new = 8;
  TH_REQUIRE(wk_greedy_generate(m, &pa, p, 30, &o, g3, &n3, err, sizeof(err)) == 0);
  wk_page_alloc_free(&pa);
  wk_model_free(m);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
  TH_REQUIRE(setup(&f, "gemma4", 0, MD_ST_BF16) == 0);
  TH_REQUIRE(wk_greedy_generate(f.m, &f.pa, p, 30, &o, g4, &n4, err, sizeof(err)) == 0);
  TH_CHECK(!memcmp(g3, g4, sizeof(g3)));
  teardown(&f);
}

TH_TEST(bad_batches_are_refused) {
  struct fixture f;
  TH_REQUIRE(setup(&f, "gemma4", 0, MD_ST_BF16) == 0);
  const struct wk_kv_spec *kv = wk_model_kv_spec(f.m);
  struct wk_seq_blocks blk = {0};
  TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &f.pa, 8) == 0);
  int32_t toks[8] = {2, 5, 6, 7, 8, 9, 10, 11};
  struct wk_seq_input s = {.tokens = toks, .n_tokens = 8, .pos0 = 0, .n_out = 1};
  wkt_seq_pages(&s, kv, &blk);
  static float logits[512];
  struct wk_batch b = {.seqs = &s, .n_seqs = 1, .logits = logits};
  char err[256];
  toks[3] = 512;
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), CM_ERR_RANGE);
  TH_CHECK(strstr(err, "512") != NULL);
  toks[3] = -1;
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), CM_ERR_RANGE);
  toks[3] = 7;
  s.pos0 = 100; /* no block for these positions */
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), CM_ERR_RANGE);
  s.pos0 = 0;
  int32_t bad = 1 << 30;
  s.block_tables[0] = &bad;
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), CM_ERR_RANGE);
  s.block_tables[0] = blk.table[0];
  s.n_out = 9;
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), CM_ERR_INVAL);
  s.n_out = 1;
  struct wk_seq_input many[5];
  for (int i = 0; i < 5; i++)
    many[i] = s;
  struct wk_batch b5 = {.seqs = many, .n_seqs = 5, .logits = logits};
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b5, err, sizeof(err)), CM_ERR_TOOBIG);
  /* still usable, and deterministic */
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), 0);
  static float again[512];
  b.logits = again;
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), 0);
  TH_CHECK(!memcmp(logits, again, sizeof(again)));
  wk_seq_blocks_release(&blk, kv, &f.pa);
  teardown(&f);
}

/* The scheduler frees sliding-window blocks that no query can see any more
 * (their table entries become -1): logits must not change. */
TH_TEST(sliding_blocks_freed_out_of_window) {
  struct fixture f;
  TH_REQUIRE(setup(&f, "gemma4", 0, MD_ST_BF16) == 0);
  const struct wk_kv_spec *kv = wk_model_kv_spec(f.m);
  int32_t p[NP];
  make_prompt(p, NP, f.V, 9);
  size_t bytes = sizeof(float) * (size_t)NP * f.V;
  struct seq s = {.tokens = p, .n = NP, .logits = calloc(1, bytes)};
  TH_REQUIRE(run_all(&f, &s, 1, 8) == 0);
  float *ref = s.logits;
  struct wk_seq_blocks blk = {0};
  float *got = calloc(1, bytes);
  int freed = 0;
  char err[256];
  for (int pos = 0; pos < NP; pos += 8) {
    int n = NP - pos < 8 ? NP - pos : 8;
    TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &f.pa, pos + n) == 0);
    struct wk_seq_input in = {.tokens = p + pos, .n_tokens = n, .pos0 = pos, .n_out = n};
    int32_t tables[WK_MAX_KV_GROUPS][64];
    for (int g = 0; g < kv->n_groups; g++) {
      const struct wk_kv_group *G = &kv->groups[g];
      TH_REQUIRE(blk.n[g] <= 64);
      for (int b = 0; b < blk.n[g]; b++) {
        int last = b * G->block_tokens + G->block_tokens - 1;
        int dead = G->window > 0 && last < pos - G->window + 1;
        tables[g][b] = dead ? -1 : blk.table[g][b];
        freed += dead;
      }
      in.block_tables[g] = tables[g];
      in.n_blocks[g] = blk.n[g];
    }
    struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = got + (size_t)pos * f.V};
    TH_REQUIRE(wk_model_forward(f.m, &b, err, sizeof(err)) == 0);
  }
  TH_CHECK(freed > 0);
  TH_CHECK(memcmp(ref, got, bytes) == 0);
  wk_seq_blocks_release(&blk, kv, &f.pa);
  free(got);
  release(&f, &s, 1);
  teardown(&f);
}

/* An image's token range attends bidirectionally: positions before it are
 * unchanged, positions inside it change, and the result is the same when
 * the range runs in a chunk of its own. A range split across steps is
 * refused. */
TH_TEST(bidirectional_image_range) {
  struct fixture f;
  TH_REQUIRE(setup(&f, "gemma3", 0, MD_ST_F32) == 0);
  const struct wk_kv_spec *kv = wk_model_kv_spec(f.m);
  enum { N = 40 };
  int32_t p[N];
  make_prompt(p, N, f.V, 4);
  int32_t range[2] = {10, 20};
  static float causal[N * 512], bidir[N * 512], chunked[N * 512];
  char err[256];
  float *outs[3] = {causal, bidir, chunked};
  for (int run = 0; run < 3; run++) {
    struct wk_seq_blocks blk = {0};
    TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &f.pa, N) == 0);
    int cuts[4] = {0, N, N, N};
    if (run == 2) cuts[1] = 10, cuts[2] = 20;
    for (int c = 0; c < 3 && cuts[c] < N; c++) {
      struct wk_seq_input in = {.tokens = p + cuts[c],
                                .n_tokens = cuts[c + 1] - cuts[c],
                                .pos0 = cuts[c],
                                .n_out = cuts[c + 1] - cuts[c]};
      if (run) in.bidir = range, in.n_bidir = 1;
      wkt_seq_pages(&in, kv, &blk);
      struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = outs[run] + (size_t)cuts[c] * f.V};
      TH_REQUIRE(wk_model_forward(f.m, &b, err, sizeof(err)) == 0);
    }
    wk_seq_blocks_release(&blk, kv, &f.pa);
  }
  size_t row = sizeof(float) * (size_t)f.V;
  TH_CHECK(memcmp(causal, bidir, 10 * row) == 0);
  TH_CHECK(memcmp(causal + 10 * f.V, bidir + 10 * f.V, row) != 0);
  TH_CHECK(memcmp(bidir, chunked, (size_t)N * row) == 0);
  /* a range crossing a step boundary */
  struct wk_seq_blocks blk = {0};
  TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &f.pa, N) == 0);
  struct wk_seq_input in = {
      .tokens = p, .n_tokens = 15, .pos0 = 0, .n_out = 1, .bidir = range, .n_bidir = 1};
  wkt_seq_pages(&in, kv, &blk);
  struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = causal};
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "[10, 20)") != NULL);
  wk_seq_blocks_release(&blk, kv, &f.pa);
  teardown(&f);
}

/* A multimodal-style checkpoint (model_type gemma4 with text_config, tensors
 * under model.language_model.) loads and computes the same logits. */
TH_TEST(multimodal_prefix_and_nested_config) {
  char plain[256], mm[256], err[256];
  struct tl_tiny_spec s;
  struct tl_tiny_opts o = {.arch = "gemma4", .preset = "tiny", .vocab = 512};
  TH_REQUIRE(wkt_tmpdir(plain, sizeof(plain)) == 0 && wkt_tmpdir(mm, sizeof(mm)) == 0);
  TH_REQUIRE(tl_tiny_spec_build(&s, &o, err, sizeof(err)) == 0);
  TH_REQUIRE(tl_tiny_write(&s, plain, 3, MD_ST_BF16) == 0);
  for (int i = 0; i < s.n_tensors; i++) {
    char tmp[160];
    TH_REQUIRE(!strncmp(s.tensors[i].name, "model.", 6));
    snprintf(tmp, sizeof(tmp), "model.language_model.%s", s.tensors[i].name + 6);
    memcpy(s.tensors[i].name, tmp, sizeof(tmp));
  }
  size_t n = strlen(s.config_json) + 64;
  char *nested = malloc(n);
  snprintf(nested, n, "{\"model_type\": \"gemma4\", \"text_config\": %s}", s.config_json);
  free(s.config_json);
  s.config_json = nested;
  TH_REQUIRE(tl_tiny_write(&s, mm, 3, MD_ST_BF16) == 0);
  tl_tiny_spec_free(&s);
  static float out[2][512];
  for (int k = 0; k < 2; k++) {
    struct kn_backend *be = NULL;
    kn_cpu_backend_create(1, &be);
    struct wk_model *m = NULL;
    struct wk_model_opts mo = {.max_batch_tokens = 32, .max_seqs = 1, .kv_tokens = 64, .quiet = 1};
    TH_REQUIRE(wk_model_load(k ? mm : plain, be, &mo, &m, err, sizeof(err)) == 0);
    TH_CHECK_EQ_STR(wk_model_config(m)->model_type, k ? "gemma4" : "gemma4_text");
    struct wk_page_alloc pa;
    wk_page_alloc_init(&pa, wk_model_n_pages(m));
    int32_t toks[20], gen[1];
    make_prompt(toks, 20, 512, 8);
    int ng;
    struct wk_greedy_opts go = {.max_new = 1, .logits = out[k]};
    TH_REQUIRE(wk_greedy_generate(m, &pa, toks, 20, &go, gen, &ng, err, sizeof(err)) == 0);
    wk_page_alloc_free(&pa);
    wk_model_free(m);
    kn_backend_destroy(be);
  }
  TH_CHECK(memcmp(out[0], out[1], sizeof(out[0])) == 0);
  wkt_rmdir(plain);
  wkt_rmdir(mm);
}

TH_TEST(kv_pool_sized_in_bytes) {
  char dir[256], err[256];
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), "gemma4", 0, 0, MD_ST_BF16, 1) == 0);
  struct kn_backend *be = NULL;
  kn_cpu_backend_create(1, &be);
  struct wk_model *m = NULL;
  struct wk_model_opts mo = {.kv_tokens = 100, .quiet = 1};
  TH_REQUIRE(wk_model_load(dir, be, &mo, &m, err, sizeof(err)) == 0);
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  int want = 0;
  for (int g = 0; g < kv->n_groups; g++)
    want += wk_kv_blocks_for(kv, g, 100);
  TH_CHECK_EQ_INT(wk_model_n_pages(m), want);
  size_t page = kv->page_bytes;
  wk_model_free(m);
  mo.kv_bytes = 10 * page + page / 2;
  TH_REQUIRE(wk_model_load(dir, be, &mo, &m, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(wk_model_n_pages(m), 10);
  wk_model_free(m);
  mo.kv_bytes = page / 2;
  TH_CHECK_EQ_INT(wk_model_load(dir, be, &mo, &m, err, sizeof(err)), CM_ERR_RANGE);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}

/* The final-normed hidden states come back beside the logits: for Gemma 3
 * (tied head, no softcap) logits = hidden . embed_tokens rows. */
TH_TEST(hidden_states_output) {
  struct fixture f;
  TH_REQUIRE(setup(&f, "gemma3", 0, MD_ST_BF16) == 0);
  const struct wk_kv_spec *kv = wk_model_kv_spec(f.m);
  int H = wk_model_config(f.m)->hidden;
  int32_t p[12];
  make_prompt(p, 12, f.V, 6);
  struct wk_seq_blocks blk = {0};
  TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &f.pa, 12) == 0);
  struct wk_seq_input in = {.tokens = p, .n_tokens = 12, .n_out = 3};
  wkt_seq_pages(&in, kv, &blk);
  static float logits[3 * 512], hidden[3 * 64];
  struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = logits, .hidden = hidden};
  char err[256];
  TH_REQUIRE(H == 64 && wk_model_forward(f.m, &b, err, sizeof(err)) == 0);
  struct md_st *st = NULL;
  TH_REQUIRE(md_st_open_dir(f.dir, &st, err, sizeof(err)) == 0);
  const struct md_tensor *E = md_st_find(st, "model.embed_tokens.weight");
  TH_REQUIRE(E && E->dtype == MD_ST_BF16);
  double maxerr = 0;
  for (int r = 0; r < 3; r++)
    for (int v = 0; v < f.V; v++) {
      double s = 0;
      for (int i = 0; i < H; i++)
        s += (double)hidden[r * H + i] *
             kn_bf16_to_f32(((const uint16_t *)E->data)[(size_t)v * H + i]);
      double e = fabs(s - logits[r * f.V + v]);
      maxerr = e > maxerr ? e : maxerr;
    }
  TH_CHECK(maxerr < 1e-4);
  md_st_close(st);
  wk_seq_blocks_release(&blk, kv, &f.pa);
  teardown(&f);
}

/* wk_batch.masks_ready: the masks are filled when it is called (a worker's
 * thread finishes them while a device runs the pass). */
struct late_masks {
  uint32_t *bits; /* [2][words] */
  int words, V, calls, rc;
};

static int fill_late(void *arg) {
  struct late_masks *l = arg;
  l->calls++;
  if (l->rc) return l->rc;
  memset(l->bits, 0, sizeof(uint32_t) * 2 * (size_t)l->words);
  for (int v = 0; v < l->V; v++) {
    if (v % 7 == 3) l->bits[v / 32] |= 1u << (v % 32);            /* row 0 */
    if (v % 5 == 1) l->bits[l->words + v / 32] |= 1u << (v % 32); /* row 1 */
  }
  return 0;
}

/* Masks completed by wk_batch.masks_ready before the rows sample: the tokens of
 * the same step with the masks filled beforehand (greedy and seeded, each
 * allowed by its mask); an error from it fails the step with that error. */
TH_TEST(masks_ready_before_the_rows_sample) {
  struct fixture f;
  TH_REQUIRE(setup(&f, "gemma3", 0, MD_ST_BF16) == 0);
  const struct wk_kv_spec *kv = wk_model_kv_spec(f.m);
  int32_t p[12];
  make_prompt(p, 12, f.V, 9);
  struct wk_seq_blocks blk = {0};
  TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &f.pa, 12) == 0);
  struct wk_seq_input in = {.tokens = p, .n_tokens = 12, .n_out = 2};
  wkt_seq_pages(&in, kv, &blk);
  int words = (f.V + 31) / 32;
  uint32_t *bits = calloc(2 * (size_t)words, sizeof(uint32_t));
  TH_REQUIRE(bits);
  struct late_masks late = {bits, words, f.V, 0, 0};
  struct kn_sample_params sp[2];
  struct kn_sample_out early[2], got[2];
  for (int r = 0; r < 2; r++) {
    kn_sample_params_default(&sp[r]);
    sp[r].allow = bits + (size_t)r * words;
  }
  sp[0].temperature = 0.0f;
  sp[1].temperature = 0.9f;
  sp[1].seed = 77;
  char err[256];
  TH_REQUIRE(fill_late(&late) == 0); /* filled beforehand */
  struct wk_batch b = {.seqs = &in, .n_seqs = 1, .sample = sp, .sampled = early};
  TH_REQUIRE(wk_model_forward(f.m, &b, err, sizeof(err)) == 0);
  memset(bits, 0, sizeof(uint32_t) * 2 * (size_t)words); /* allows nothing until the hook */
  late.calls = 0;
  b.sampled = got;
  b.masks_ready = fill_late;
  b.masks_arg = &late;
  TH_REQUIRE(wk_model_forward(f.m, &b, err, sizeof(err)) == 0);
  TH_CHECK(late.calls >= 1);
  for (int r = 0; r < 2; r++) {
    TH_CHECK_EQ_INT(got[r].token, early[r].token);
    TH_CHECK(got[r].token % (r ? 5 : 7) == (r ? 1 : 3));
  }
  late.rc = CM_ERR_NOMEM;
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), CM_ERR_NOMEM);
  free(bits);
  wk_seq_blocks_release(&blk, kv, &f.pa);
  teardown(&f);
}

/* One decode step of every sequence of s[ns] whose prompt is done, on f: the
 * sequences' next tokens come from out_tok (their last sampled token, else
 * their prompt's last); row i samples greedily when i is even, else with
 * temperature 0.9 and a seed. Each gets block room for its next position. */
static int sample_step(struct fixture *f, struct seq *s, int ns, int32_t *toks, int counter) {
  struct wk_seq_input in[4];
  struct kn_sample_params sp[4];
  struct kn_sample_out so[4];
  const struct wk_kv_spec *kv = wk_model_kv_spec(f->m);
  for (int i = 0; i < ns; i++) {
    if (wk_seq_blocks_reserve(&s[i].blk, kv, &f->pa, s[i].done + 1)) return -1;
    seq_input(&in[i], &s[i], kv, &toks[i], 1);
    kn_sample_params_default(&sp[i]);
    if (i % 2) {
      sp[i].temperature = 0.9f;
      sp[i].seed = 1234 + (uint64_t)i;
      sp[i].counter = (uint64_t)counter;
    }
  }
  struct wk_batch b = {.seqs = in, .n_seqs = ns, .sample = sp, .sampled = so};
  int rc = forward(f, &b);
  if (rc) return rc;
  for (int i = 0; i < ns; i++) {
    toks[i] = so[i].token;
    s[i].done++;
  }
  return 0;
}

/* Decode steps padded to buckets (WK_GRAPHS_PAD: what step graphs replay,
 * without capturing) give the bits of ordinary steps: logits of every row as
 * the batch shrinks from 3 sequences (bucket 4) to 2 and 1, across block
 * boundaries and past the sliding window; greedy and seeded tokens through
 * the sampled head, which reads the padded step's logits instead of the fused
 * matmul-argmax. Gemma 4 has KV-shared layers (the padded step runs every
 * row through them) and per-layer inputs. */
static void check_padded_decode(const char *arch) {
  struct fixture f[2];
  float *ref[3] = {0};
  int32_t pa[70], pb[41], pc[55];
  for (int pad = 0; pad < 2; pad++) {
    g_step_graphs = pad ? WK_GRAPHS_PAD : WK_GRAPHS_OFF;
    TH_REQUIRE(setup(&f[pad], arch, 0, MD_ST_F32) == 0);
    g_step_graphs = WK_GRAPHS_OFF;
    make_prompt(pa, 70, f[pad].V, 8);
    make_prompt(pb, 41, f[pad].V, 9);
    make_prompt(pc, 55, f[pad].V, 10);
    struct seq s[3] = {{.tokens = pa, .n = 70}, {.tokens = pb, .n = 41}, {.tokens = pc, .n = 55}};
    for (int i = 0; i < 3; i++)
      TH_REQUIRE((s[i].logits = calloc((size_t)s[i].n * f[pad].V, sizeof(float))) != NULL);
    TH_REQUIRE(step(&f[pad], s, 3, 12) == 0); /* a prefill chunk, then decodes */
    TH_REQUIRE(run_all(&f[pad], s, 3, 1) == 0);
    for (int i = 0; i < 3; i++) {
      if (!pad) {
        ref[i] = s[i].logits;
        s[i].logits = NULL;
      } else if (memcmp(ref[i], s[i].logits, sizeof(float) * (size_t)s[i].n * f[pad].V)) {
        th_fail(__FILE__, __LINE__, "%s: sequence %d: logits differ in padded steps", arch, i);
      }
    }
    release(&f[pad], s, 3);
  }
  for (int i = 0; i < 3; i++)
    free(ref[i]);
  /* sampled heads: 3 sequences after a prefill, 20 decode steps each */
  int32_t toks[2][3];
  struct seq s[2][3];
  for (int pad = 0; pad < 2; pad++) {
    for (int i = 0; i < 3; i++) {
      s[pad][i] = (struct seq){.tokens = i == 0 ? pa : i == 1 ? pb : pc, .n = 30 + i};
      TH_REQUIRE((s[pad][i].logits = calloc((size_t)(30 + i) * f[pad].V, sizeof(float))) != NULL);
    }
    TH_REQUIRE(step(&f[pad], s[pad], 3, 64) == 0);
    for (int i = 0; i < 3; i++)
      toks[pad][i] = s[pad][i].tokens[s[pad][i].n - 1];
  }
  for (int t = 0; t < 20; t++)
    for (int pad = 0; pad < 2; pad++)
      TH_REQUIRE(sample_step(&f[pad], s[pad], 3, toks[pad], t) == 0);
  for (int i = 0; i < 3; i++)
    TH_CHECK_EQ_INT(toks[1][i], toks[0][i]);
  for (int pad = 0; pad < 2; pad++) {
    release(&f[pad], s[pad], 3);
    teardown(&f[pad]);
  }
}

TH_TEST(padded_decode_buckets_change_nothing) {
  check_padded_decode("gemma3");
  check_padded_decode("gemma4");
}

/* Speculative verification in step-graph buckets: steps whose sequences each run R
 * tokens with every row's logits and final-normed state (a token and R - 1 drafts,
 * as the worker verifies them) run padded to a bucket of R-token sequences (padding
 * rows of R tokens, no KV writes), and give the bits of ordinary steps: logits and
 * states, over a prefill chunk, across blocks and past the sliding window, with the
 * last uneven steps (fewer tokens left) eager. */
static void check_padded_verify(const char *arch, int R) {
  struct fixture f[2];
  float *ref[3][2] = {{0}};
  int32_t pa[70], pb[41], pc[55];
  uint64_t padded_steps = 0;
  for (int pad = 0; pad < 2; pad++) {
    g_step_graphs = pad ? WK_GRAPHS_PAD : WK_GRAPHS_OFF;
    g_verify_tokens = R;
    TH_REQUIRE(setup(&f[pad], arch, 0, MD_ST_F32) == 0);
    g_step_graphs = g_verify_tokens = 0;
    int H = wk_model_config(f[pad].m)->hidden;
    make_prompt(pa, 70, f[pad].V, 18);
    make_prompt(pb, 41, f[pad].V, 19);
    make_prompt(pc, 55, f[pad].V, 20);
    struct seq s[3] = {{.tokens = pa, .n = 70}, {.tokens = pb, .n = 41}, {.tokens = pc, .n = 55}};
    for (int i = 0; i < 3; i++) {
      s[i].logits = calloc((size_t)s[i].n * f[pad].V, sizeof(float));
      s[i].hidden = calloc((size_t)s[i].n * H, sizeof(float));
      TH_REQUIRE(s[i].logits && s[i].hidden);
    }
    TH_REQUIRE(step(&f[pad], s, 3, 12) == 0); /* a prefill chunk, then verification steps */
    TH_REQUIRE(run_all(&f[pad], s, 3, R) == 0);
    for (int k = 0; k < f[pad].m->n_buckets; k++)
      if (f[pad].m->bucket_tokens[k] == R) padded_steps += f[pad].m->bucket_steps[k];
    for (int i = 0; i < 3; i++) {
      size_t nl = sizeof(float) * (size_t)s[i].n * f[pad].V,
             nh = sizeof(float) * (size_t)s[i].n * H;
      if (!pad) {
        ref[i][0] = s[i].logits, ref[i][1] = s[i].hidden;
        s[i].logits = s[i].hidden = NULL;
      } else if (memcmp(ref[i][0], s[i].logits, nl) || memcmp(ref[i][1], s[i].hidden, nh)) {
        th_fail(__FILE__, __LINE__, "%s: sequence %d: logits or states differ in padded steps",
                arch, i);
      }
    }
    release(&f[pad], s, 3);
    teardown(&f[pad]);
  }
  /* the three ran together in a bucket of four until the shortest had fewer than R left */
  TH_CHECK(padded_steps >= (41 - 12) / (uint64_t)R);
  for (int i = 0; i < 3; i++)
    free(ref[i][0]), free(ref[i][1]);
}

TH_TEST(padded_verify_buckets_change_nothing) {
  check_padded_verify("gemma3", 4);
  check_padded_verify("gemma4", 3);
}

/* Padding rows (CUDA-graph buckets fill a decode step up to a fixed size) change
 * no bit of the real rows' logits, write nothing into the cache (the real rows
 * read their own pages afterwards), and a padding row with an output is refused. */
TH_TEST(padding_rows_change_nothing) {
  struct fixture f;
  TH_REQUIRE(setup(&f, "gemma4", 0, MD_ST_F32) == 0);
  int32_t pa[40], pb[25], pc[33];
  make_prompt(pa, 40, f.V, 4);
  make_prompt(pb, 25, f.V, 5);
  make_prompt(pc, 33, f.V, 6);
  float *ref[3];
  for (int pad = 0; pad < 2; pad++) {
    g_pad_to = pad ? 4 : 0;
    struct seq s[3] = {{.tokens = pa, .n = 40}, {.tokens = pb, .n = 25}, {.tokens = pc, .n = 33}};
    for (int i = 0; i < 3; i++)
      TH_REQUIRE((s[i].logits = calloc((size_t)s[i].n * f.V, sizeof(float))) != NULL);
    /* a prefill chunk of each, then token-by-token steps: the padded ones decode */
    TH_REQUIRE(step(&f, s, 3, 16) == 0);
    TH_REQUIRE(run_all(&f, s, 3, 1) == 0);
    for (int i = 0; i < 3; i++) {
      if (!pad) {
        ref[i] = s[i].logits;
        s[i].logits = NULL;
      } else if (memcmp(ref[i], s[i].logits, sizeof(float) * (size_t)s[i].n * f.V)) {
        th_fail(__FILE__, __LINE__, "sequence %d: logits differ with padding rows", i);
      }
    }
    release(&f, s, 3);
  }
  g_pad_to = 0;
  for (int i = 0; i < 3; i++)
    free(ref[i]);
  /* a padding row that asks for an output */
  struct seq s = {.tokens = pa, .n = 40, .logits = calloc((size_t)40 * f.V, sizeof(float))};
  TH_REQUIRE(s.logits && step(&f, &s, 1, 16) == 0);
  const struct wk_kv_spec *kv = wk_model_kv_spec(f.m);
  static const int32_t tok = 0;
  struct wk_seq_input in = {.tokens = &tok, .n_tokens = 1, .n_out = 1, .pad = 1};
  for (int g = 0; g < kv->n_groups; g++) {
    in.block_tables[g] = s.blk.table[g];
    in.n_blocks[g] = 1;
  }
  static float out[512 * 1024];
  struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = out};
  char err[256] = "";
  TH_CHECK_EQ_INT(wk_model_forward(f.m, &b, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "padding row") != NULL);
  release(&f, &s, 1);
  teardown(&f);
}
