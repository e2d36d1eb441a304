/* test-images.c — requests with images in the planner: a prefill chunk never ends
 * inside an image (its end moves back to the image's start, or past its end when
 * the chunk begins there); each plan sequence lists exactly the images its tokens
 * meet, with their payloads; the prefix cache keys an image's blocks on its hash
 * (same text, other image: a hit only before the image); the step's image bytes
 * stay under the cap; admission refuses images that cannot be scheduled. An
 * audio clip (proto's PR_MEDIA_AUDIO) is held whole the same way, its kind
 * passed on and keyed: a clip and an image of one hash share no block. */
#include <stdio.h>
#include <string.h>

#include "common/cm-err.h"
#include "proto/pr-msg.h"
#include "scheduler/sch-engine.h"
#include "tests/harness/th.h"
#include "tests/unit/scheduler/sch-test-util.h"

#define IMG_ID 900 /* the placeholder id the fake prompts use for soft tokens */

static struct fake_worker g_rank = {.rng = 1};
static uint8_t g_pix[4][64];

static struct sch_engine *engine(int32_t budget, uint64_t cap_bytes) {
  struct sch_engine_config c;
  fake_config(&c, 256, 4, budget, 8, 512);
  c.max_image_bytes_per_step = cap_bytes;
  return fake_engine(&c);
}

/* A prompt of n ids with image runs at the given positions (IMG_ID there). */
static void prompt_with(int32_t *p, int32_t n, const struct sch_image *im, int32_t n_im) {
  for (int32_t i = 0; i < n; i++)
    p[i] = 20 + i % 50;
  for (int32_t k = 0; k < n_im; k++)
    for (int32_t t = 0; t < im[k].num_tokens; t++)
      p[im[k].pos + t] = IMG_ID;
}

static int add(struct sch_engine *e, uint64_t id, const int32_t *p, int32_t n,
               const struct sch_image *im, int32_t n_im, char *err, size_t errlen) {
  struct sch_request_params q = {0};
  q.id = id;
  q.prompt = p;
  q.prompt_len = n;
  q.max_tokens = 4;
  q.images = im;
  q.num_images = n_im;
  return sch_engine_add(e, &q, err, errlen);
}

static void step(struct sch_engine *e, struct sch_plan *plan) {
  fake_step(e, &g_rank, plan);
}

/* The chunk [s, s + n) cuts no image, and lists exactly the images it meets. */
static void check_chunk(const struct sch_plan_seq *s, const struct sch_image *im, int32_t n_im) {
  int32_t b = s->start_pos, e = s->start_pos + s->num_tokens, met = 0;
  for (int32_t k = 0; k < n_im; k++) {
    int32_t x0 = im[k].pos, x1 = x0 + im[k].num_tokens;
    TH_CHECK(!(e > x0 && e < x1)); /* the end is never inside */
    if (x1 > b && x0 < e) {
      TH_REQUIRE(met < s->num_images);
      TH_CHECK_EQ_INT(s->images[met].pos, x0);
      TH_CHECK(s->images[met].hash == im[k].hash);
      TH_CHECK(s->images[met].len == im[k].len);
      TH_CHECK(memcmp(s->images[met].data, im[k].data, im[k].len) == 0);
      TH_CHECK(s->images[met].data != im[k].data); /* the engine's own copy */
      met++;
    }
  }
  TH_CHECK_EQ_INT(s->num_images, met);
}

/* Budget 10, an item of 6 tokens at 7 (of kind `kind0`) then an image of 8 at
 * 22: the plain 10-token cuts would land inside both. Each plan lists the
 * items with their kinds. */
static void chunk_ends_around(uint32_t kind0) {
  struct sch_image im[2] = {{7, 6, 111, g_pix[0], 64, 4, 3, kind0}, {22, 8, 222, g_pix[1], 64}};
  int32_t p[40];
  prompt_with(p, 40, im, 2);
  struct sch_engine *e = engine(10, 0);
  char err[256];
  TH_REQUIRE(add(e, 1, p, 40, im, 2, err, sizeof(err)) == 0);
  int32_t ends[16], n_ends = 0;
  struct sch_plan plan;
  for (int guard = 0; guard < 20; guard++) {
    step(e, &plan);
    const struct sch_plan_seq *s = fake_find_seq(&plan, 1);
    if (!s || s->start_pos >= 40) break;
    check_chunk(s, im, 2);
    for (int32_t k = 0; k < s->num_images; k++)
      TH_CHECK_EQ_INT((int)s->images[k].kind, s->images[k].pos == 7 ? (int)kind0 : 0);
    ends[n_ends++] = s->start_pos + s->num_tokens;
  }
  /* 0..7 (moved back to item 0), 7..17 (item 0 and text), 17..22 (moved back to
   * image 1), 22..32 (image 1 and text), 32..40 */
  int32_t want[] = {7, 17, 22, 32, 40};
  TH_REQUIRE(n_ends == 5);
  for (int i = 0; i < 5; i++)
    TH_CHECK_EQ_INT(ends[i], want[i]);
  sch_engine_destroy(e);
}

TH_TEST(chunks_never_end_inside_an_image) {
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 64; j++)
      g_pix[i][j] = (uint8_t)(i * 64 + j);
  chunk_ends_around(0);
}

TH_TEST(an_image_waits_for_room_rather_than_split) {
  /* a decode takes one token of a 10-token budget: the 10-token image of the
   * second request waits for a step with room */
  struct sch_image im = {0, 10, 5, g_pix[2], 64};
  int32_t p[12];
  prompt_with(p, 12, &im, 1);
  int32_t q[3] = {30, 31, 32};
  struct sch_engine *e = engine(10, 0);
  char err[256];
  TH_REQUIRE(add(e, 1, q, 3, NULL, 0, err, sizeof(err)) == 0);
  struct sch_plan plan;
  step(e, &plan); /* request 1's prefill */
  TH_REQUIRE(add(e, 2, p, 12, &im, 1, err, sizeof(err)) == 0);
  step(e, &plan); /* 1 decodes (1 token): 9 left, the image needs 10 */
  TH_CHECK(fake_find_seq(&plan, 1) != NULL);
  TH_CHECK(fake_find_seq(&plan, 2) == NULL);
  int seen = 0;
  for (int guard = 0; guard < 10 && !seen; guard++) {
    step(e, &plan);
    const struct sch_plan_seq *s = fake_find_seq(&plan, 2);
    if (s) {
      check_chunk(s, &im, 1);
      TH_CHECK(s->num_tokens >= 10);
      seen = 1;
    }
  }
  TH_CHECK(seen);
  sch_engine_destroy(e);
}

/* Runs what came before to its end, then admits request id (n ids of p, with
 * item im or none) and plans one step: the prompt tokens found cached. */
static int hits_of(struct sch_engine *e, uint64_t id, const int32_t *p, int32_t n,
                   const struct sch_image *im, struct sch_plan *plan) {
  char err[256];
  struct sch_engine_stats st;
  for (int i = 0; i < 6; i++)
    step(e, plan);
  sch_engine_stats(e, &st);
  uint64_t h0 = st.prefix_hits;
  TH_REQUIRE(add(e, id, p, n, im, im ? 1 : 0, err, sizeof(err)) == 0);
  step(e, plan);
  sch_engine_stats(e, &st);
  return (int)(st.prefix_hits - h0);
}

/* In a fresh engine (blocks of 4), p (32 ids, 16 text tokens, the 8 of `same` at 16,
 * 8 more) as request 1 finds nothing cached; the same ids and media again, every
 * block but the last; the same ids with `other` at its place (media the cache must
 * tell apart from `same`), only the 16 text tokens before it. Returns the engine, for
 * the caller to go on with and destroy; *plan is the last request's step. */
static struct sch_engine *same_media_then_other(const int32_t *p, const struct sch_image *same,
                                                const struct sch_image *other,
                                                struct sch_plan *plan) {
  struct sch_engine *e = engine(64, 0);
  TH_CHECK_EQ_INT(hits_of(e, 1, p, 32, same, plan), 0);
  TH_CHECK_EQ_INT(hits_of(e, 2, p, 32, same, plan), 28);
  TH_CHECK_EQ_INT(hits_of(e, 3, p, 32, other, plan), 16);
  return e;
}

TH_TEST(prefix_cache_keys_images_on_their_hash) {
  /* 16 text tokens, an image of 8 at 16, 8 more text: blocks of 4 */
  struct sch_image a = {16, 8, 0xaaaa, g_pix[0], 64}, b = {16, 8, 0xbbbb, g_pix[1], 64};
  int32_t p[32];
  prompt_with(p, 32, &a, 1);
  struct sch_plan plan;
  struct sch_engine *e = same_media_then_other(p, &a, &b, &plan);
  const struct sch_plan_seq *s = fake_find_seq(&plan, 3);
  TH_REQUIRE(s != NULL);
  TH_CHECK_EQ_INT(s->start_pos, 16);
  TH_CHECK_EQ_INT(s->num_images, 1);
  TH_CHECK(s->images[0].hash == 0xbbbb);
  /* a prompt without images whose ids are those of the image run: no hit into it */
  TH_CHECK_EQ_INT(hits_of(e, 4, p, 32, NULL, &plan), 16);
  sch_engine_destroy(e);
}

TH_TEST(audio_clips_are_never_split_and_keyed_on_their_kind) {
  chunk_ends_around(PR_MEDIA_AUDIO); /* a clip moves the chunk ends as an image does */
  /* blocks of 4: 16 text tokens, a clip of 8 at 16, 8 more; the same clip again
   * hits every block but the last, an image of the same hash only the text */
  struct sch_image clip = {16, 8, 0xcccc, g_pix[2], 64, 4, 3, PR_MEDIA_AUDIO};
  struct sch_image pic = {16, 8, 0xcccc, g_pix[2], 64};
  int32_t q[32];
  prompt_with(q, 32, &clip, 1);
  struct sch_plan plan;
  struct sch_engine *e = same_media_then_other(q, &clip, &pic, &plan);
  sch_engine_destroy(e);
}

TH_TEST(a_hit_may_end_inside_an_image) {
  /* blocks of 4, an image of 8 at 6: a cached prefix ends at 8, inside it; the chunk
   * then begins inside the image and carries it */
  struct sch_image a = {6, 8, 77, g_pix[3], 64};
  int32_t p[20];
  prompt_with(p, 20, &a, 1);
  struct sch_engine *e = engine(64, 0);
  char err[256];
  struct sch_plan plan;
  TH_REQUIRE(add(e, 1, p, 20, &a, 1, err, sizeof(err)) == 0);
  for (int i = 0; i < 6; i++)
    step(e, &plan);
  /* a 12-token prompt whose run [6, 12) carries the same image hash: its keys
   * match the cached blocks through 8, inside the run; the chunk begins there
   * and carries the image, which begins before it */
  int32_t q[12];
  memcpy(q, p, sizeof(q));
  struct sch_image a2 = a;
  a2.num_tokens = 6;
  TH_REQUIRE(add(e, 2, q, 12, &a2, 1, err, sizeof(err)) == 0);
  step(e, &plan);
  const struct sch_plan_seq *s = fake_find_seq(&plan, 2);
  TH_REQUIRE(s != NULL);
  TH_CHECK_EQ_INT(s->start_pos, 8);
  TH_CHECK_EQ_INT(s->num_tokens, 4);
  TH_REQUIRE(s->num_images == 1);
  TH_CHECK_EQ_INT(s->images[0].pos, 6);
  for (int i = 0; i < 6; i++)
    step(e, &plan);
  /* the same image and prompt: hit up to 16 (the last token always runs) */
  TH_REQUIRE(add(e, 3, p, 20, &a, 1, err, sizeof(err)) == 0);
  step(e, &plan);
  s = fake_find_seq(&plan, 3);
  TH_REQUIRE(s != NULL);
  TH_CHECK_EQ_INT(s->start_pos, 16);
  TH_CHECK_EQ_INT(s->num_images, 0);
  sch_engine_destroy(e);
}

TH_TEST(image_bytes_per_step_are_capped) {
  /* two requests, one 64-byte image each; a cap of 100 bytes: one image per step */
  struct sch_image a = {2, 4, 1, g_pix[0], 64}, b = {2, 4, 2, g_pix[1], 64};
  int32_t p[8], q[8];
  prompt_with(p, 8, &a, 1);
  prompt_with(q, 8, &b, 1);
  struct sch_engine *e = engine(64, 100);
  char err[256];
  struct sch_plan plan;
  TH_REQUIRE(add(e, 1, p, 8, &a, 1, err, sizeof(err)) == 0);
  TH_REQUIRE(add(e, 2, q, 8, &b, 1, err, sizeof(err)) == 0);
  step(e, &plan);
  const struct sch_plan_seq *s1 = fake_find_seq(&plan, 1), *s2 = fake_find_seq(&plan, 2);
  TH_REQUIRE(s1 != NULL);
  TH_CHECK_EQ_INT(s1->num_images, 1);
  /* the second request's chunk stops before its image */
  if (s2) {
    TH_CHECK_EQ_INT(s2->num_images, 0);
    TH_CHECK(s2->start_pos + s2->num_tokens <= 2);
  }
  step(e, &plan);
  s2 = fake_find_seq(&plan, 2);
  TH_REQUIRE(s2 != NULL);
  TH_CHECK_EQ_INT(s2->num_images, 1);
  sch_engine_destroy(e);
}

TH_TEST(admission_refuses_bad_images) {
  struct sch_engine *e = engine(10, 0);
  int32_t p[40];
  prompt_with(p, 40, NULL, 0);
  char err[256];
  struct sch_image big = {0, 11, 1, g_pix[0], 64}; /* more than one step's tokens */
  TH_CHECK_EQ_INT(add(e, 1, p, 40, &big, 1, err, sizeof(err)), CM_ERR_TOOBIG);
  TH_CHECK(strstr(err, "max-num-batched-tokens") != NULL);
  struct sch_image out = {35, 8, 1, g_pix[0], 64}; /* past the prompt's end */
  TH_CHECK_EQ_INT(add(e, 2, p, 40, &out, 1, err, sizeof(err)), CM_ERR_INVAL);
  struct sch_image overlap[2] = {{4, 4, 1, g_pix[0], 64}, {6, 4, 2, g_pix[1], 64}};
  TH_CHECK_EQ_INT(add(e, 3, p, 40, overlap, 2, err, sizeof(err)), CM_ERR_INVAL);
  struct sch_image empty = {4, 0, 1, g_pix[0], 64};
  TH_CHECK_EQ_INT(add(e, 4, p, 40, &empty, 1, err, sizeof(err)), CM_ERR_INVAL);
  sch_engine_destroy(e);
}
