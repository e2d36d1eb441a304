/* test-wk-vision-forward.c — Gemma 3 prompts with images through the text
 * forward pass (CPU backend, f32 weights and KV cache), on the generated
 * multimodal checkpoint:
 *   - every position's logits of a prompt with two images (soft-token rows
 *     from wk_vision_encode, bidirectional image ranges) against
 *     tests/reference/gemma3_mm_ref.py, an independent numpy implementation
 *     written from transformers (skipped, loudly, without python3 or numpy);
 *     once more with a sliding window shorter than an image;
 *   - the same bits when the prompt runs in chunks that keep each image whole,
 *     and when a second sequence reuses the first blocks up to a block
 *     boundary inside an image (a prefix-cache hit) and runs only the rest,
 *     also with a window of 8 (the step's first queries then see the image's
 *     cached positions only through its range);
 *   - without the bidirectional ranges the logits change from the first image
 *     on and match the reference's --causal run instead;
 *   - a greedy continuation, one token per forward, equal to the reference's.
 *
 * The prompt is laid out as the Hugging Face processor builds one: text,
 * "\n\n", <start_of_image>, mm_tokens image tokens, <end_of_image>, "\n\n",
 * more text, a second image, more text. The first image crosses a 16-token
 * block boundary. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "kernels/cpu/kn-cpu.h"
#include "tests/unit/worker/wk-test-util.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"
#include "worker/wk-vision.h"

/* Logits against the reference: max |C - reference| below this fraction of
 * the reference's logit range (f32 C against float64 numpy). */
#define LOGIT_TOL 1e-5

#define N_IMAGES 2
#define N_GREEDY 8 /* tokens of the greedy continuation */
#define MAX_T    128
#define NL_ID    108 /* "\n\n" in the Gemma tokenizer; any id is fine here */

/* ---- the fixture -------------------------------------------------------------------- */

struct fx {
  char dir[4096];
  const char *python; /* NULL when the test does not need the reference */
  struct kn_backend *be;
  struct wk_model *m;
  struct wk_vision *vis;
  struct wk_page_alloc pa;
  const struct wk_kv_spec *kv;
  int V, H, M;                          /* vocabulary, text hidden size, soft tokens per image */
  int image_id;                         /* <image_soft_token> */
  float *emb;                           /* [N_IMAGES * M, H] the images' soft-token rows */
  int32_t ids[MAX_T];                   /* the prompt, then room for the greedy tokens */
  int T;                                /* prompt tokens */
  int32_t ranges[N_IMAGES][2];          /* each image's [begin, end) */
  struct wk_seq_embed embeds[N_IMAGES]; /* rows at those positions */
};

/* Text ids: anything but the special and image ids at the ends of the vocabulary. */
static int32_t text_id(uint32_t *st, int V) {
  *st = *st * 1664525u + 1013904223u;
  return (int32_t)(5 + (*st >> 8) % (uint32_t)(V - 8));
}

/* bos, 6 text, "\n\n", boi, image 0 at [9, 25), eoi, "\n\n", 26 text,
 * "\n\n", boi, image 1 at [55, 71), eoi, "\n\n", 6 text: 79 tokens. Image 0
 * crosses position 16 (a block boundary of the 16-token group), image 1
 * position 64 (a boundary of every group: prefix hits are multiples of the
 * groups' block sizes' lcm). */
static void build_prompt(struct fx *f, int boi, int eoi) {
  uint32_t st = 77;
  int n = 0;
  f->ids[n++] = 2;
  for (int i = 0; i < 6; i++)
    f->ids[n++] = text_id(&st, f->V);
  for (int img = 0; img < N_IMAGES; img++) {
    f->ids[n++] = NL_ID;
    f->ids[n++] = boi;
    f->ranges[img][0] = n;
    for (int i = 0; i < f->M; i++)
      f->ids[n++] = f->image_id;
    f->ranges[img][1] = n;
    f->embeds[img] = (struct wk_seq_embed){
        .pos = f->ranges[img][0], .n = f->M, .rows = f->emb + (size_t)img * f->M * f->H};
    f->ids[n++] = eoi;
    f->ids[n++] = NL_ID;
    int text = img == 0 ? 26 : 6;
    for (int i = 0; i < text; i++)
      f->ids[n++] = text_id(&st, f->V);
  }
  f->T = n;
}

/* window: the text model's sliding window (0: the generated model's 64). */
static void setup(struct fx *f, int window, int need_python) {
  memset(f, 0, sizeof(*f));
  f->python =
      need_python ? th_require_numpy("the image prompt's logits", "gemma3_mm_ref.py") : NULL;
  struct tl_tiny_opts o = {
      .arch = "gemma3", .preset = "tiny", .vocab = 512, .vision = 1, .sliding_window = window};
  wkt_make_tiny(f->dir, sizeof(f->dir), &o, 12, MD_ST_F32);
  char err[512] = "";
  TH_REQUIRE(kn_cpu_backend_create(2, &f->be) == 0 && f->be);
  struct wk_model_opts mo = {
      .max_batch_tokens = MAX_T, .max_seqs = 2, .kv_tokens = 1024, .kv_dtype = 1, .quiet = 1};
  if (wk_model_load(f->dir, f->be, &mo, &f->m, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "text model: %s", err);
    th_stop();
  }
  f->kv = wk_model_kv_spec(f->m);
  TH_REQUIRE(f->kv->dtype == KN_DTYPE_F32);
  TH_REQUIRE(wk_page_alloc_init(&f->pa, wk_model_n_pages(f->m)) == 0);
  if (wk_vision_load(f->dir, f->be, NULL, &f->vis, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "vision tower: %s", err);
    th_stop();
  }
  const struct md_vision_cfg *vc = wk_vision_config(f->vis);
  f->V = wk_model_config(f->m)->vocab;
  f->H = wk_vision_text_hidden(f->vis);
  f->M = vc->mm_tokens;
  f->image_id = vc->image_id;
  TH_REQUIRE(f->H == wk_model_config(f->m)->hidden);
  TH_REQUIRE(f->M == 16); /* the layout below puts the images across 16 and 64 */

  size_t n_px = (size_t)N_IMAGES * vc->channels * vc->image_size * vc->image_size;
  float *px = malloc(n_px * sizeof(float));
  f->emb = malloc((size_t)N_IMAGES * f->M * f->H * sizeof(float));
  TH_REQUIRE(px && f->emb);
  wkt_fill_pixels(px, N_IMAGES, vc->channels, vc->image_size, 0x1ace);
  if (wk_vision_encode(f->vis, px, N_IMAGES, f->emb, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "encode: %s", err);
    th_stop();
  }
  char path[4200];
  snprintf(path, sizeof(path), "%s/pixels.f32", f->dir);
  TH_REQUIRE(wkt_write_file(path, px, n_px * sizeof(float)) == 0);
  free(px);
  build_prompt(f, vc->boi_id, vc->eoi_id);
  TH_REQUIRE(f->T + N_GREEDY <= MAX_T);
}

static void teardown(struct fx *f) {
  wk_page_alloc_free(&f->pa);
  wk_vision_free(f->vis);
  wk_model_free(f->m);
  kn_backend_destroy(f->be);
  free(f->emb);
  cm_rmtree(f->dir);
}

/* ---- running the C forward pass ------------------------------------------------------ */

/* One sequence's block tables (per KV group). */
struct tables {
  const int32_t *t[WK_MAX_KV_GROUPS];
  int n[WK_MAX_KV_GROUPS];
};

static struct tables tables_of(const struct fx *f, const struct wk_seq_blocks *b) {
  struct tables tb = {0};
  for (int g = 0; g < f->kv->n_groups; g++) {
    tb.t[g] = b->table[g];
    tb.n[g] = b->n[g];
  }
  return tb;
}

/* What a run hands the forward pass besides the tokens. */
struct mm_in {
  const int32_t *ranges; /* [n_ranges, 2] bidirectional ranges, or NULL */
  int n_ranges;
  const struct wk_seq_embed *embeds; /* [n_embeds] */
  int n_embeds;
};

static struct mm_in images_of(const struct fx *f) {
  return (struct mm_in){&f->ranges[0][0], N_IMAGES, f->embeds, N_IMAGES};
}

/* Runs the steps [cuts[i], cuts[i + 1]) of f->ids, i < n_steps, one forward
 * each with every token's logits, into out[position, V]. */
static void run_steps(struct fx *f, const struct tables *tb, const struct mm_in *in,
                      const int *cuts, int n_steps, float *out) {
  char err[512] = "";
  for (int i = 0; i < n_steps; i++) {
    int p0 = cuts[i], n = cuts[i + 1] - cuts[i];
    struct wk_seq_input s = {.tokens = f->ids + p0,
                             .n_tokens = n,
                             .pos0 = p0,
                             .n_out = n,
                             .bidir = in->n_ranges ? in->ranges : NULL,
                             .n_bidir = in->n_ranges,
                             .embeds = in->n_embeds ? in->embeds : NULL,
                             .n_embeds = in->n_embeds};
    for (int g = 0; g < f->kv->n_groups; g++) {
      s.block_tables[g] = tb->t[g];
      s.n_blocks[g] = tb->n[g];
    }
    struct wk_batch b = {.seqs = &s, .n_seqs = 1, .logits = out + (size_t)p0 * f->V};
    if (wk_model_forward(f->m, &b, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "forward [%d, %d): %s", p0, p0 + n, err);
      th_stop();
    }
  }
}

/* The whole prompt in one forward, into fresh blocks (kept in blk). */
static float *run_whole(struct fx *f, struct wk_seq_blocks *blk, const struct mm_in *in,
                        int extra) {
  float *out = calloc((size_t)(f->T + extra) * f->V, sizeof(float));
  TH_REQUIRE(out);
  memset(blk, 0, sizeof(*blk));
  TH_REQUIRE(wk_seq_blocks_reserve(blk, f->kv, &f->pa, f->T + extra) == 0);
  struct tables tb = tables_of(f, blk);
  int cuts[2] = {0, f->T};
  run_steps(f, &tb, in, cuts, 1, out);
  return out;
}

/* ---- the reference ------------------------------------------------------------------- */

/* gemma3_mm_ref.py's logits [n, V] for f->ids[0 .. n), into want. */
static void run_reference(struct fx *f, int n, int causal, float *want) {
  char ids_path[4200], px_path[4200], out_path[4200], script[4200], count[16], log[8192];
  snprintf(ids_path, sizeof(ids_path), "%s/ids.i32", f->dir);
  snprintf(px_path, sizeof(px_path), "%s/pixels.f32", f->dir);
  snprintf(out_path, sizeof(out_path), "%s/reference.f32", f->dir);
  snprintf(script, sizeof(script), "%s/reference/gemma3_mm_ref.py", th_tests_dir());
  snprintf(count, sizeof(count), "%d", N_IMAGES);
  TH_REQUIRE(wkt_write_file(ids_path, f->ids, (size_t)n * sizeof(int32_t)) == 0);
  char *argv[] = {(char *)f->python,          script, f->dir, ids_path, px_path, count, out_path,
                  causal ? "--causal" : NULL, NULL};
  int rc = cm_run_capture(argv, log, sizeof(log));
  if (rc != 0) {
    th_fail(__FILE__, __LINE__, "gemma3_mm_ref.py exited with %d:\n%s", rc, log);
    th_stop();
  }
  TH_REQUIRE(wkt_read_f32(out_path, want, (size_t)n * f->V) == 0);
}

static int argmax(const float *row, int V) {
  int best = 0;
  for (int i = 1; i < V; i++)
    if (row[i] > row[best]) best = i;
  return best;
}

/* Max |got - want| over rows [r0, r1) as a fraction of want's range over those rows,
 * and the number of rows whose argmax differs. */
struct cmp {
  double worst, range, rel;
  int worst_row, argmax_diff, first_diff_row;
};

static struct cmp compare(const float *got, const float *want, int r0, int r1, int V) {
  struct cmp c = {.first_diff_row = -1};
  double lo = INFINITY, hi = -INFINITY;
  for (int r = r0; r < r1; r++) {
    const float *g = got + (size_t)r * V, *w = want + (size_t)r * V;
    for (int i = 0; i < V; i++) {
      lo = fmin(lo, w[i]);
      hi = fmax(hi, w[i]);
      double e = fabs((double)g[i] - (double)w[i]);
      if (!(e <= c.worst)) {
        c.worst = isnan(e) ? INFINITY : e;
        c.worst_row = r;
      }
    }
    if (argmax(g, V) != argmax(w, V)) {
      if (c.first_diff_row < 0) c.first_diff_row = r;
      c.argmax_diff++;
    }
  }
  c.range = hi - lo;
  c.rel = c.worst / c.range;
  return c;
}

/* got within LOGIT_TOL of want, same argmax on every row of [r0, r1). */
static void check_close(const char *what, const float *got, const float *want, int r0, int r1,
                        int V) {
  struct cmp c = compare(got, want, r0, r1, V);
  printf("%s: rows [%d, %d) logit range %.4f, max abs error %.3g (%.3g of the range, row %d), "
         "%d argmax differences\n",
         what, r0, r1, c.range, c.worst, c.rel, c.worst_row, c.argmax_diff);
  TH_CHECK(c.range > 0.1); /* the logits are not degenerate */
  if (!(c.rel < LOGIT_TOL))
    th_fail(__FILE__, __LINE__, "%s: max abs error %g at row %d is %g of the range %g (limit %g)",
            what, c.worst, c.worst_row, c.rel, c.range, LOGIT_TOL);
  if (c.argmax_diff)
    th_fail(__FILE__, __LINE__, "%s: argmax differs at %d rows, the first at row %d", what,
            c.argmax_diff, c.first_diff_row);
}

static int same_rows(const float *a, const float *b, int r0, int r1, int V) {
  return memcmp(a + (size_t)r0 * V, b + (size_t)r0 * V, sizeof(float) * (size_t)(r1 - r0) * V) == 0;
}

/* ---- 1. the whole prompt against the reference ---------------------------------------- */

static void check_whole_prompt(int window, const char *what) {
  struct fx f;
  setup(&f, window, 1);
  struct wk_seq_blocks blk;
  struct mm_in in = images_of(&f);
  float *got = run_whole(&f, &blk, &in, 0);
  float *want = malloc((size_t)f.T * f.V * sizeof(float));
  TH_REQUIRE(want);
  run_reference(&f, f.T, 0, want);
  check_close(what, got, want, 0, f.T, f.V);
  wk_seq_blocks_release(&blk, f.kv, &f.pa);
  free(got);
  free(want);
  teardown(&f);
}

TH_TEST(image_prompt_matches_reference) {
  check_whole_prompt(0, "image prompt vs gemma3_mm_ref.py");
}

/* A window of 8 positions, shorter than an image: an image token sees its
 * whole image in the sliding layers too (transformers ORs the image mask
 * with the windowed causal one). */
TH_TEST(image_prompt_matches_reference_window_inside_image) {
  check_whole_prompt(8, "image prompt, window 8, vs gemma3_mm_ref.py");
}

/* ---- 2. chunks that keep each image whole ---------------------------------------------- */

TH_TEST(image_prompt_chunked_is_bit_identical) {
  struct fx f;
  setup(&f, 0, 0);
  struct wk_seq_blocks blk;
  struct mm_in in = images_of(&f);
  float *whole = run_whole(&f, &blk, &in, 0);
  wk_seq_blocks_release(&blk, f.kv, &f.pa);

  /* chunks ending right before each image, one starting at an image's first
   * token and one at its boi, every range and row handed to every step */
  int i0 = f.ranges[0][0], i1 = f.ranges[1][0];
  int cuts[][6] = {{0, i0, i1 - 1, f.ranges[1][1] + 1, f.T, -1},
                   {0, 3, i0 - 1, f.ranges[0][1] + 4, i1, f.T}};
  int n_steps[] = {4, 5};
  float *got = calloc((size_t)f.T * f.V, sizeof(float));
  TH_REQUIRE(got);
  for (size_t k = 0; k < CM_ARRAY_LEN(cuts); k++) {
    memset(got, 0, (size_t)f.T * f.V * sizeof(float));
    memset(&blk, 0, sizeof(blk));
    TH_REQUIRE(wk_seq_blocks_reserve(&blk, f.kv, &f.pa, f.T) == 0);
    struct tables tb = tables_of(&f, &blk);
    run_steps(&f, &tb, &in, cuts[k], n_steps[k], got);
    wk_seq_blocks_release(&blk, f.kv, &f.pa);
    if (!same_rows(got, whole, f.T - 1, f.T, f.V))
      th_fail(__FILE__, __LINE__, "chunking %zu: the last position's logits differ", k);
    if (!same_rows(got, whole, 0, f.T, f.V))
      th_fail(__FILE__, __LINE__, "chunking %zu: some position's logits differ", k);
  }
  free(got);
  free(whole);
  teardown(&f);
}

/* ---- 3. a prefix hit that ends inside an image ------------------------------------------- */

static void check_prefix_hit(int window) {
  struct fx f;
  setup(&f, window, 0);
  struct mm_in in = images_of(&f);
  struct wk_seq_blocks P;
  float *whole = run_whole(&f, &P, &in, 0);

  /* a prefix hit is a multiple of every group's block size: the first such
   * boundary inside an image */
  int align = 1;
  for (int g = 0; g < f.kv->n_groups; g++) {
    int a = align, b = f.kv->groups[g].block_tokens;
    while (b) {
      int r = a % b;
      a = b;
      b = r;
    }
    align = align / a * f.kv->groups[g].block_tokens;
  }
  int cut = -1, img = -1;
  for (int i = 0; i < N_IMAGES && cut < 0; i++) {
    int c = (f.ranges[i][0] / align + 1) * align;
    if (c < f.ranges[i][1]) cut = c, img = i;
  }
  if (cut < 0) {
    th_fail(__FILE__, __LINE__, "no multiple of %d falls inside an image", align);
    th_stop();
  }
  printf("prefix hit at %d (blocks of %d and more), inside image %d [%d, %d)\n", cut, align, img,
         f.ranges[img][0], f.ranges[img][1]);

  /* the second sequence: P's pages below the cut, its own above */
  struct wk_seq_blocks Q = {0};
  TH_REQUIRE(wk_seq_blocks_reserve(&Q, f.kv, &f.pa, f.T) == 0);
  int32_t tab[WK_MAX_KV_GROUPS][MAX_T];
  struct tables tb = {0};
  for (int g = 0; g < f.kv->n_groups; g++) {
    TH_REQUIRE(Q.n[g] <= MAX_T && P.n[g] == Q.n[g]);
    for (int b = 0; b < Q.n[g]; b++)
      tab[g][b] = b < cut / f.kv->groups[g].block_tokens ? P.table[g][b] : Q.table[g][b];
    tb.t[g] = tab[g];
    tb.n[g] = Q.n[g];
  }
  /* the cut image's rows from the cut on, images after it whole; the ranges
   * as they are (the cut image's begins before the step) */
  struct wk_seq_embed rest[N_IMAGES];
  int n_rest = 0;
  for (int i = img; i < N_IMAGES; i++) {
    rest[n_rest] = f.embeds[i];
    if (i == img) {
      rest[n_rest].pos = cut;
      rest[n_rest].n = f.ranges[i][1] - cut;
      rest[n_rest].rows += (size_t)(cut - f.ranges[i][0]) * f.H;
    }
    n_rest++;
  }
  struct mm_in tail = {&f.ranges[0][0], N_IMAGES, rest, n_rest};
  float *got = calloc((size_t)f.T * f.V, sizeof(float));
  TH_REQUIRE(got);
  int cuts[2] = {cut, f.T};
  run_steps(&f, &tb, &tail, cuts, 1, got);
  if (!same_rows(got, whole, f.T - 1, f.T, f.V))
    th_fail(__FILE__, __LINE__, "prefix hit at %d: the last position's logits differ", cut);
  if (!same_rows(got, whole, cut, f.T, f.V))
    th_fail(__FILE__, __LINE__, "prefix hit at %d: some position's logits differ", cut);
  /* the same with the image's full row list (the rows before the step skipped) */
  memset(got, 0, (size_t)f.T * f.V * sizeof(float));
  run_steps(&f, &tb, &in, cuts, 1, got);
  if (!same_rows(got, whole, cut, f.T, f.V))
    th_fail(__FILE__, __LINE__, "prefix hit at %d, whole row lists: logits differ", cut);

  wk_seq_blocks_release(&Q, f.kv, &f.pa);
  wk_seq_blocks_release(&P, f.kv, &f.pa);
  free(got);
  free(whole);
  teardown(&f);
}

TH_TEST(image_prefix_hit_inside_image_is_bit_identical) {
  check_prefix_hit(0);
}

/* With a window of 8 the first queries of the step see the image's earlier
 * positions (in the shared blocks) only through its bidirectional range. */
TH_TEST(image_prefix_hit_inside_image_window_8) {
  check_prefix_hit(8);
}

/* ---- 4. causal only: the mask is what differs ------------------------------------------ */

TH_TEST(image_prompt_causal_only_matches_causal_reference) {
  struct fx f;
  setup(&f, 0, 1);
  struct wk_seq_blocks b1, b2;
  struct mm_in in = images_of(&f);
  struct mm_in causal_in = {NULL, 0, f.embeds, N_IMAGES};
  float *bidir = run_whole(&f, &b1, &in, 0);
  float *causal = run_whole(&f, &b2, &causal_in, 0);
  wk_seq_blocks_release(&b1, f.kv, &f.pa);
  wk_seq_blocks_release(&b2, f.kv, &f.pa);

  /* before the first image nothing changes; from its first token on every
   * position does */
  int i0 = f.ranges[0][0];
  TH_CHECK(same_rows(causal, bidir, 0, i0, f.V));
  int unchanged = 0;
  for (int r = i0; r < f.T; r++)
    unchanged += same_rows(causal, bidir, r, r + 1, f.V);
  TH_CHECK_EQ_INT(unchanged, 0);

  float *want = malloc((size_t)f.T * f.V * sizeof(float));
  float *want_bidir = malloc((size_t)f.T * f.V * sizeof(float));
  TH_REQUIRE(want && want_bidir);
  run_reference(&f, f.T, 1, want);
  check_close("causal-only prompt vs gemma3_mm_ref.py --causal", causal, want, 0, f.T, f.V);
  /* and the reference's two masks are far apart compared with the tolerance:
   * the C causal run is nowhere near the bidirectional reference */
  run_reference(&f, f.T, 0, want_bidir);
  struct cmp apart = compare(causal, want_bidir, i0, f.T, f.V);
  printf("causal-only C vs the bidirectional reference: max abs difference %.3g (%.3g of the "
         "range), %d argmax differences\n",
         apart.worst, apart.rel, apart.argmax_diff);
  TH_CHECK(apart.rel > 100 * LOGIT_TOL);
  free(want);
  free(want_bidir);
  free(bidir);
  free(causal);
  teardown(&f);
}

/* ---- 5. greedy continuation ------------------------------------------------------------- */

TH_TEST(image_prompt_greedy_continuation_matches_reference) {
  struct fx f;
  setup(&f, 0, 1);
  struct wk_seq_blocks blk;
  struct mm_in in = images_of(&f);
  float *got = run_whole(&f, &blk, &in, N_GREEDY);
  struct tables tb = tables_of(&f, &blk);
  /* token i comes from position T - 1 + i; tokens 0 .. N_GREEDY - 2 are fed back */
  int32_t gen[N_GREEDY];
  for (int i = 0; i < N_GREEDY; i++) {
    int p = f.T - 1 + i;
    if (i > 0) {
      int cuts[2] = {p, p + 1};
      run_steps(&f, &tb, &in, cuts, 1, got);
    }
    gen[i] = argmax(got + (size_t)p * f.V, f.V);
    f.ids[p + 1] = gen[i];
  }
  int n = f.T + N_GREEDY - 1;
  printf("greedy continuation:");
  for (int i = 0; i < N_GREEDY; i++)
    printf(" %d", gen[i]);
  printf("\n");
  for (int i = 0; i < N_GREEDY; i++)
    TH_CHECK(gen[i] != f.image_id); /* the reference would take it for an image token */

  /* the reference on the extended ids: its argmax at each position is its own
   * greedy choice given the same prefix */
  float *want = malloc((size_t)n * f.V * sizeof(float));
  TH_REQUIRE(want);
  run_reference(&f, n, 0, want);
  int first_diff = -1;
  for (int i = 0; i < N_GREEDY && first_diff < 0; i++)
    if (argmax(want + (size_t)(f.T - 1 + i) * f.V, f.V) != gen[i]) first_diff = i;
  if (first_diff >= 0)
    th_fail(__FILE__, __LINE__, "greedy token %d: C chose %d, the reference %d", first_diff,
            gen[first_diff], argmax(want + (size_t)(f.T - 1 + first_diff) * f.V, f.V));
  check_close("greedy decode steps vs gemma3_mm_ref.py", got, want, f.T, n, f.V);
  wk_seq_blocks_release(&blk, f.kv, &f.pa);
  free(got);
  free(want);
  teardown(&f);
}
