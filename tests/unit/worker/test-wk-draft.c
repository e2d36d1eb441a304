/* test-wk-draft.c — the Gemma 4 MTP assistant's draft step against a tiny
 * target: determinism, batch invariance, dense vs ordered token choice, and
 * that each draft layer reads exactly its target source layer's pages. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "tests/harness/th.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-greedy.h"
#include "worker/wk-model-impl.h"
#include "worker/wk-model.h"

#define NP 100

struct rig {
  char tdir[256], ddir[256];
  struct kn_backend *be;
  struct wk_model *t, *d;
  struct wk_page_alloc pa;
  struct wk_seq_blocks blk[2];
  float h[2][64];  /* target hidden at the last prompt position */
  int32_t next[2]; /* target's greedy next token */
};

/* A pseudo-random prompt of NP tokens below 512, from seed. */
static void lcg_prompt(int32_t *p, uint32_t seed) {
  uint32_t x = seed;
  for (int i = 0; i < NP; i++)
    p[i] = (int32_t)(((x = x * 1664525u + 1013904223u) >> 8) % 512);
}

/* The target and its assistant, both quantized at load as quant (WK_QUANT_*) says. */
static int setup_q(struct rig *r, int ordered, int quant) {
  memset(r, 0, sizeof(*r));
  char err[256];
  if (wkt_make_model(r->tdir, sizeof(r->tdir), "gemma4", 0, 0, MD_ST_F32, 5)) return -1;
  if (kn_cpu_backend_create(2, &r->be)) return -1;
  struct wk_model_opts o = {
      .max_batch_tokens = 128, .max_seqs = 4, .kv_tokens = 512, .quiet = 1, .quantization = quant};
  if (wk_model_load(r->tdir, r->be, &o, &r->t, err, sizeof(err))) return -1;
  struct tl_tiny_spec s;
  if (tl_tiny_spec_assistant(&s, wk_model_config(r->t), err, sizeof(err))) return -1;
  if (!ordered) {
    char *p = strstr(s.config_json, "\"use_ordered_embeddings\": true");
    if (!p) return -1;
    memcpy(p, "\"use_ordered_embeddings\":false", 30);
  }
  if (wkt_tmpdir(r->ddir, sizeof(r->ddir)) || tl_tiny_write(&s, r->ddir, 9, MD_ST_F32)) return -1;
  tl_tiny_spec_free(&s);
  if (wk_draft_load(r->ddir, r->t, &o, &r->d, err, sizeof(err))) {
    fprintf(stderr, "draft load: %s\n", err);
    return -1;
  }
  if (wk_page_alloc_init(&r->pa, wk_model_n_pages(r->t))) return -1;
  const struct wk_kv_spec *kv = wk_model_kv_spec(r->t);
  for (int q = 0; q < 2; q++) {
    int32_t p[NP];
    lcg_prompt(p, 17 + (uint32_t)q);
    if (wk_seq_blocks_reserve(&r->blk[q], kv, &r->pa, NP)) return -1;
    struct wk_seq_input in = {.tokens = p, .n_tokens = NP, .n_out = 1};
    wkt_seq_pages(&in, kv, &r->blk[q]);
    static float logits[512];
    struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = logits, .hidden = r->h[q]};
    if (wk_model_forward(r->t, &b, err, sizeof(err))) return -1;
    r->next[q] = wk_argmax(logits, 512);
  }
  return 0;
}

static int setup(struct rig *r, int ordered) {
  return setup_q(r, ordered, WK_QUANT_NONE);
}

static void teardown(struct rig *r) {
  for (int q = 0; q < 2; q++)
    wk_seq_blocks_release(&r->blk[q], wk_model_kv_spec(r->t), &r->pa);
  wk_page_alloc_free(&r->pa);
  wk_model_free(r->d);
  wk_model_free(r->t);
  kn_backend_destroy(r->be);
  wkt_rmdir(r->tdir);
  wkt_rmdir(r->ddir);
}

static struct wk_draft_input input(struct rig *r, int q, int32_t tok, const float *h) {
  struct wk_draft_input in = {.token = tok, .pos = NP - 1, .h_in = h};
  const struct wk_kv_spec *kv = wk_model_kv_spec(r->t);
  for (int g = 0; g < kv->n_groups; g++) {
    in.block_tables[g] = r->blk[q].table[g];
    in.n_blocks[g] = r->blk[q].n[g];
  }
  return in;
}

/* Three chained draft steps of sequence q: tokens and the last h_out. */
static int chain(struct rig *r, int q, int32_t toks[3], float hout[64]) {
  char err[256];
  float h[64];
  memcpy(h, r->h[q], sizeof(h));
  int32_t tok = r->next[q];
  for (int k = 0; k < 3; k++) {
    struct wk_draft_input in = input(r, q, tok, h);
    if (wk_draft_step(r->d, &in, 1, &toks[k], hout, NULL, err, sizeof(err))) {
      fprintf(stderr, "draft: %s\n", err);
      return -1;
    }
    tok = toks[k];
    memcpy(h, hout, sizeof(h));
  }
  return 0;
}

TH_TEST(draft_deterministic_and_batch_invariant) {
  struct rig r;
  TH_REQUIRE(setup(&r, 1) == 0);
  TH_CHECK(wk_model_config(r.d)->use_ordered_embeddings);
  int32_t a[3], b[3], c[3];
  float ha[64], hb[64], hc[64];
  TH_REQUIRE(chain(&r, 0, a, ha) == 0);
  TH_REQUIRE(chain(&r, 0, b, hb) == 0);
  TH_CHECK(!memcmp(a, b, sizeof(a)) && !memcmp(ha, hb, sizeof(ha)));
  TH_REQUIRE(chain(&r, 1, c, hc) == 0);
  for (int k = 0; k < 3; k++)
    TH_CHECK(a[k] >= 0 && a[k] < 512);
  TH_CHECK(memcmp(ha, hc, sizeof(ha)) != 0);
  /* both sequences in one step give each one's own first step */
  struct wk_draft_input two[2] = {input(&r, 0, r.next[0], r.h[0]), input(&r, 1, r.next[1], r.h[1])};
  int32_t t2[2], t1;
  static float h2[2 * 64], h1[64];
  char err[256];
  TH_REQUIRE(wk_draft_step(r.d, two, 2, t2, h2, NULL, err, sizeof(err)) == 0);
  TH_REQUIRE(wk_draft_step(r.d, &two[1], 1, &t1, h1, NULL, err, sizeof(err)) == 0);
  TH_CHECK(t1 == t2[1] && !memcmp(h1, h2 + 64, sizeof(h1)));
  /* a position without a block is refused */
  struct wk_draft_input bad = two[0];
  bad.pos = 10000;
  TH_CHECK_EQ_INT(wk_draft_step(r.d, &bad, 1, &t1, h1, NULL, err, sizeof(err)), CM_ERR_RANGE);
  teardown(&r);
}

TH_TEST(draft_dense_token_is_argmax) {
  struct rig r;
  TH_REQUIRE(setup(&r, 0) == 0);
  TH_CHECK(!wk_model_config(r.d)->use_ordered_embeddings);
  struct wk_draft_input in = input(&r, 0, r.next[0], r.h[0]);
  int32_t tok;
  static float h[64], logits[512];
  char err[256];
  TH_REQUIRE(wk_draft_step(r.d, &in, 1, &tok, h, logits, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT(tok, wk_argmax(logits, 512));
  float lo = logits[0], hi = logits[0];
  for (int i = 0; i < 512; i++)
    lo = fminf(lo, logits[i]), hi = fmaxf(hi, logits[i]);
  TH_CHECK(hi - lo > 0.1f);
  teardown(&r);
}

/* --quantization q8_0 | q4_0 reaches the assistant too: its dense head is a
 * block-format matrix like the target's, while a head that picks its
 * candidates' rows stays as stored (kn_matmul_rows takes rows of f32, f16 or
 * bf16), and a draft chain runs either way. */
TH_TEST(draft_with_block_quantization) {
  const int quants[] = {WK_QUANT_Q8_0, WK_QUANT_Q4_0};
  for (int qi = 0; qi < 2; qi++)
    for (int ordered = 0; ordered < 2; ordered++) {
      struct rig r;
      TH_REQUIRE(setup_q(&r, ordered, quants[qi]) == 0);
      TH_CHECK(kn_block_elems(r.t->layers[0].wq.dt) > 0);
      TH_CHECK_EQ_INT(kn_block_elems(r.d->lm_head.dt) > 0, !ordered);
      int32_t a[3];
      float ha[64];
      TH_CHECK(chain(&r, 0, a, ha) == 0);
      for (int k = 0; k < 3; k++)
        TH_CHECK(a[k] >= 0 && a[k] < 512);
      teardown(&r);
    }
}

/* Zeroes the K and V of target layer `layer` in the pages its group holds
 * for the rig's sequences (pages of other groups have other layouts). */
static void wipe_layer(struct rig *r, int layer) {
  struct wk_model *t = r->t;
  const struct wk_kv_spec *kv = &t->kv;
  int g = kv->layer_group[layer];
  const struct wk_kv_group *G = &kv->groups[g];
  size_t half = (size_t)G->block_tokens * G->n_kv_heads * G->head_dim * kn_dtype_size(kv->dtype);
  for (int q = 0; q < 2; q++)
    for (int b = 0; b < r->blk[q].n[g]; b++) {
      char *page = (char *)t->pool + (size_t)r->blk[q].table[g][b] * kv->page_bytes;
      memset(page + kv->layer_k_off[layer], 0, half);
      memset(page + kv->layer_v_off[layer], 0, half);
    }
}

/* Draft layers read the target's last storing layer of their kind (tiny
 * target: sliding layer 3, full layer 2) and nothing else. */
TH_TEST(draft_reads_target_source_layers) {
  struct rig r;
  TH_REQUIRE(setup(&r, 1) == 0);
  const struct md_config *tc = wk_model_config(r.t);
  TH_CHECK_EQ_INT(md_config_last_storing_layer(tc, MD_LAYER_SLIDING), 3);
  TH_CHECK_EQ_INT(md_config_last_storing_layer(tc, MD_LAYER_FULL), 2);
  int32_t base[3], t[3];
  float hb[64], h[64];
  TH_REQUIRE(chain(&r, 0, base, hb) == 0);
  wipe_layer(&r, 0);
  wipe_layer(&r, 1);
  TH_REQUIRE(chain(&r, 0, t, h) == 0);
  TH_CHECK(!memcmp(base, t, sizeof(t)) && !memcmp(hb, h, sizeof(h)));
  wipe_layer(&r, 2); /* the full layers' source */
  TH_REQUIRE(chain(&r, 0, t, h) == 0);
  TH_CHECK(memcmp(hb, h, sizeof(h)) != 0);
  float h2[64];
  memcpy(h2, h, sizeof(h2));
  wipe_layer(&r, 3); /* the sliding layers' source */
  TH_REQUIRE(chain(&r, 0, t, h) == 0);
  TH_CHECK(memcmp(h2, h, sizeof(h)) != 0);
  teardown(&r);
}

TH_TEST(draft_load_errors) {
  char dir[256], adir[256], err[256];
  TH_REQUIRE(wkt_make_model(dir, sizeof(dir), "gemma3", 0, 0, MD_ST_BF16, 1) == 0);
  struct kn_backend *be = NULL;
  kn_cpu_backend_create(1, &be);
  struct wk_model *t = NULL, *d = NULL;
  struct wk_model_opts o = {.quiet = 1, .kv_tokens = 64};
  TH_REQUIRE(wk_model_load(dir, be, &o, &t, err, sizeof(err)) == 0);
  /* a gemma3 checkpoint is not an assistant */
  TH_CHECK_EQ_INT(wk_draft_load(dir, t, &o, &d, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(strstr(err, "not a gemma4_assistant") != NULL);
  /* an assistant made for another target */
  char g4[256];
  TH_REQUIRE(wkt_make_model(g4, sizeof(g4), "gemma4", 0, 0, MD_ST_BF16, 1) == 0);
  struct wk_model *t4 = NULL;
  TH_REQUIRE(wk_model_load(g4, be, &o, &t4, err, sizeof(err)) == 0);
  struct tl_tiny_spec s;
  TH_REQUIRE(tl_tiny_spec_assistant(&s, wk_model_config(t4), err, sizeof(err)) == 0);
  TH_REQUIRE(wkt_tmpdir(adir, sizeof(adir)) == 0 && tl_tiny_write(&s, adir, 1, MD_ST_BF16) == 0);
  tl_tiny_spec_free(&s);
  TH_CHECK_EQ_INT(wk_draft_load(adir, t, &o, &d, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "does not fit") != NULL);
  TH_CHECK_EQ_INT(wk_draft_load(adir, t4, &o, &d, err, sizeof(err)), 0);
  wk_model_free(d);
  wk_model_free(t4);
  wk_model_free(t);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
  wkt_rmdir(g4);
  wkt_rmdir(adir);
}

/* ---- speculative decoding against plain greedy decoding ---------------------- */

enum { SPEC_MAX_NEW = 32 };

/* A rig, a prompt of NP tokens and what plain greedy decoding makes of it: n
 * tokens (want) and their logits (wl), which every speculative run must give
 * exactly: its ng tokens into got and their logits into gl. */
struct greedy_run {
  struct rig r;
  int32_t p[NP];
  int n;
  int32_t want[SPEC_MAX_NEW], got[SPEC_MAX_NEW];
  float wl[SPEC_MAX_NEW * 512], gl[SPEC_MAX_NEW * 512];
  struct wk_greedy_opts o; /* the speculative runs' (logits into gl) */
  int ng, drafted, accepted;
  char err[256];
};

/* Sets up g's rig and decodes prompt `seed` greedily for n tokens, `chunk` at a time. */
static void greedy_run_init(struct greedy_run *g, uint32_t seed, int n, int chunk) {
  TH_REQUIRE(n <= SPEC_MAX_NEW && setup(&g->r, 1) == 0);
  lcg_prompt(g->p, seed);
  g->n = n;
  g->o = (struct wk_greedy_opts){.chunk = chunk, .max_new = n, .logits = g->wl};
  int nw;
  TH_REQUIRE(wk_greedy_generate(g->r.t, &g->r.pa, g->p, NP, &g->o, g->want, &nw, g->err,
                                sizeof(g->err)) == 0);
  TH_REQUIRE(nw == n);
  g->o.logits = g->gl;
}

/* The speculative run just made (into g->ng, g->got, g->gl) made the greedy tokens and logits. */
static void check_same_as_greedy(const struct greedy_run *g) {
  TH_CHECK_EQ_INT(g->ng, g->n);
  TH_CHECK(!memcmp(g->want, g->got, sizeof(int32_t) * (size_t)g->n));
  TH_CHECK(!memcmp(g->wl, g->gl, sizeof(float) * 512 * (size_t)g->n));
}

/* Speculative greedy decoding gives exactly the tokens (and bit-identical
 * logits) of plain greedy decoding, for several draft lengths. */
TH_TEST(speculative_greedy_equals_greedy) {
  static struct greedy_run g;
  greedy_run_init(&g, 77, 24, 32);
  for (int k = 1; k <= 4; k++) {
    memset(g.gl, 0, sizeof(g.gl));
    TH_REQUIRE(wk_greedy_generate_spec(g.r.t, g.r.d, &g.r.pa, g.p, NP, &g.o, k, g.got, &g.ng,
                                       &g.drafted, &g.accepted, g.err, sizeof(g.err)) == 0);
    check_same_as_greedy(&g);
    TH_CHECK(g.drafted > 0 && g.accepted >= 0 && g.accepted <= g.drafted);
    fprintf(stderr, "k=%d: %d drafted, %d accepted\n", k, g.drafted, g.accepted);
  }
  teardown(&g.r);
}

/* An oracle proposer that knows the greedy answer and proposes a varying
 * number of right tokens followed by wrong ones: every acceptance length,
 * the bonus token and overwritten rejected positions are exercised. */
struct oracle {
  const int32_t *want;
  int n_want, calls;
};

static int oracle_propose(void *vctx, const struct wk_seq_blocks *blk, int32_t token, int p,
                          const float *h, int kk, int32_t *drafts, int *n, char *err,
                          size_t errlen) {
  struct oracle *o = vctx;
  int i = p - (NP - 1); /* token == want[i] */
  if (i < 0 || i >= o->n_want || o->want[i] != token) {
    snprintf(err, errlen, "oracle: unexpected state at position %d", p);
    return CM_ERR_STATE;
  }
  int good = o->calls++ % (kk + 1);
  for (int q = 0; q < kk; q++) {
    int idx = i + 1 + q;
    int32_t right = idx < o->n_want ? o->want[idx] : 3;
    drafts[q] = q < good ? right : (right + 1) % 512;
  }
  /* every fourth round fewer drafts (right ones only, or none), as a lookup finds */
  *n = o->calls % 4 == 3 ? good : kk;
  return 0;
}

/* n-gram drafts (looked up in the prompt and the tokens so far): the greedy tokens
 * and logits. The prompt's ids below 512 repeat, so drafts are proposed; this model's
 * answer does not follow them (acceptance: speculative_acceptance_paths, whose oracle
 * also proposes fewer than k, and the worker's and the server's n-gram tests). */
TH_TEST(speculative_ngram_equals_greedy) {
  static struct greedy_run g;
  greedy_run_init(&g, 79, 32, 0);
  for (int k = 1; k <= 4; k++) {
    memset(g.gl, 0, sizeof(g.gl));
    TH_REQUIRE(wk_greedy_generate_ngram(g.r.t, &g.r.pa, g.p, NP, &g.o, k, 1, 3, g.got, &g.ng,
                                        &g.drafted, &g.accepted, g.err, sizeof(g.err)) == 0);
    check_same_as_greedy(&g);
    TH_CHECK(g.drafted > 0 && g.accepted >= 0 && g.accepted <= g.drafted);
    fprintf(stderr, "n-gram k=%d: %d drafted, %d accepted\n", k, g.drafted, g.accepted);
  }
  teardown(&g.r);
}

TH_TEST(speculative_acceptance_paths) {
  static struct greedy_run g;
  greedy_run_init(&g, 78, 30, 0);
  for (int k = 1; k <= 5; k++) {
    struct oracle orc = {g.want, g.n, 0};
    TH_REQUIRE(wk_greedy_generate_spec_fn(g.r.t, &g.r.pa, g.p, NP, &g.o, k, oracle_propose, &orc,
                                          g.got, &g.ng, &g.drafted, &g.accepted, g.err,
                                          sizeof(g.err)) == 0);
    check_same_as_greedy(&g);
    TH_CHECK(g.accepted > 0 && g.accepted < g.drafted);
    fprintf(stderr, "oracle k=%d: %d drafted, %d accepted, %d rounds\n", k, g.drafted, g.accepted,
            orc.calls);
  }
  TH_CHECK_EQ_INT(g.r.pa.n_free, g.r.pa.n_pages - (g.r.blk[0].n[0] + g.r.blk[0].n[1]) * 2);
  teardown(&g.r);
}
