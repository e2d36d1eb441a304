/* test-wk-soft-ids.c — rows written over a Gemma 4 prompt's soft tokens (an
 * image's or an audio clip's embeddings, wk_seq_input.embeds) stand for
 * those tokens wholly: transformers' Gemma4Model.forward looks every
 * multimodal position up as the pad token (llm_input_ids[multimodal_mask] =
 * pad_token_id), for the token embedding the rows replace and for the
 * per-layer embedding (PLE) beside it. So whatever placeholder id the prompt
 * holds there, every position's logits are the same bits; and without the
 * rows the ids do matter (the check could fail). CPU backend, f32 weights
 * and KV, the generated tiny Gemma 4 (per-layer embeddings on). */
#include <stdlib.h>
#include <string.h>

#include "tests/unit/worker/wk-test-util.h"

#define T     24
#define SOFT0 6 /* the soft tokens: positions [SOFT0, SOFT0 + NSOFT) */
#define NSOFT 9

/* Every position's logits of ids[0..T), with rows over the soft tokens when
 * rows is not NULL, into out [T, V]. */
static void logits_of(struct wk_model *m, const int32_t *ids, const float *rows, float *out) {
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  struct wk_page_alloc pa;
  struct wk_seq_blocks blk = {0};
  TH_REQUIRE(wk_page_alloc_init(&pa, wk_model_n_pages(m)) == 0);
  TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, T) == 0);
  struct wk_seq_embed e = {.pos = SOFT0, .n = NSOFT, .rows = rows};
  struct wk_seq_input in = {.tokens = ids, .n_tokens = T, .pos0 = 0, .n_out = T};
  if (rows) {
    in.embeds = &e;
    in.n_embeds = 1;
  }
  wkt_seq_pages(&in, kv, &blk);
  struct wk_batch b = {.seqs = &in, .n_seqs = 1, .logits = out};
  char err[256] = "";
  int rc = wk_model_forward(m, &b, err, sizeof(err));
  if (rc) th_fail(__FILE__, __LINE__, "forward: %s", err);
  wk_seq_blocks_release(&blk, kv, &pa);
  wk_page_alloc_free(&pa);
}

TH_TEST(soft_token_ids_do_not_matter_under_their_rows) {
  char dir[4096], err[512] = "";
  struct tl_tiny_opts o = {.arch = "gemma4", .preset = "tiny", .vocab = 512};
  wkt_make_tiny(dir, sizeof(dir), &o, 5, MD_ST_F32);
  struct kn_backend *be = wkt_cpu_backend(2);
  struct wk_model_opts mo = {
      .max_batch_tokens = T, .max_seqs = 1, .kv_tokens = 64, .kv_dtype = 1, .quiet = 1};
  struct wk_model *m = NULL;
  TH_REQUIRE(wk_model_load(dir, be, &mo, &m, err, sizeof(err)) == 0);
  const struct md_config *c = wk_model_config(m);
  TH_REQUIRE(c->ple_dim > 0); /* the case this is about */
  int V = c->vocab, H = c->hidden;
  float *rows = malloc(sizeof(float) * NSOFT * (size_t)H);
  float *a = malloc(sizeof(float) * T * (size_t)V), *b = malloc(sizeof(float) * T * (size_t)V);
  TH_REQUIRE(rows && a && b);
  for (int i = 0; i < NSOFT * H; i++)
    rows[i] = (float)(0.05 * ((i * 7919) % 201 - 100) / 100.0);
  int32_t x[T], y[T];
  for (int i = 0; i < T; i++)
    x[i] = y[i] = 5 + (i * 37) % (V - 10);
  for (int i = SOFT0; i < SOFT0 + NSOFT; i++) {
    x[i] = V - 3; /* two placeholder ids: neither is the pad */
    y[i] = 7;
  }
  TH_REQUIRE(x[SOFT0] != c->pad_id && y[SOFT0] != c->pad_id);
  logits_of(m, x, rows, a);
  logits_of(m, y, rows, b);
  TH_CHECK(memcmp(a, b, sizeof(float) * T * (size_t)V) == 0);
  /* without the rows the ids are ordinary tokens: past the first soft one, the
   * logits differ */
  logits_of(m, x, NULL, a);
  logits_of(m, y, NULL, b);
  TH_CHECK(memcmp(a + (size_t)SOFT0 * V, b + (size_t)SOFT0 * V, sizeof(float) * V) != 0);
  free(rows);
  free(a);
  free(b);
  wk_model_free(m);
  kn_backend_destroy(be);
  wkt_rmdir(dir);
}
