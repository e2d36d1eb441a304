/* test-fe-mm.c — the frontend's image and audio prompt rules (fe-mm.h): each
 * <start_of_image> the chat template writes becomes the HF processor's run
 * ("\n\n" boi, the soft tokens, eoi "\n\n"), each Gemma 4 <|audio|> becomes
 * <|audio> + N x <|audio|> + <audio|>, the markers must match the items, the
 * soft-token runs found in the ids give each image and clip its place (in
 * prompt order, each of its own kind), and --limit-mm-per-prompt takes
 * vLLM's two spellings for image and audio. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-mm.h"
#include "tests/harness/th.h"

static void small_mm(struct fe_mm *mm) {
  memset(mm, 0, sizeof(*mm));
  mm->enabled = 1;
  mm->limit = 4;
  mm->tokens = 3;
  mm->image_id = 7;
  mm->audio_id = -1;
  strcpy(mm->boi, "<boi>");
  strcpy(mm->soft, "<s>");
  strcpy(mm->eoi, "<eoi>");
}

/* small_mm with Gemma 4's image markers. */
static void g4_mm(struct fe_mm *mm) {
  small_mm(mm);
  mm->g4 = 1;
  strcpy(mm->boi, "<|image>");
  strcpy(mm->soft, "<|image|>");
  strcpy(mm->eoi, "<image|>");
}

/* Text t, with n_images images (tokens: each one's soft tokens; NULL: mm's), expands
 * to want, and the length fe_mm_expand returns is want's. */
static void expands_to(const struct fe_mm *mm, const char *t, size_t n_images, const int *tokens,
                       const char *want) {
  char *out = NULL, err[256] = "";
  size_t n = 0;
  TH_REQUIRE(fe_mm_expand(mm, t, strlen(t), n_images, tokens, &out, &n, err, sizeof(err)) == 0);
  TH_CHECK_EQ_STR(out, want);
  TH_CHECK(n == strlen(out));
  free(out);
}

TH_TEST(expand_markers) {
  struct fe_mm mm;
  small_mm(&mm);
  const char *t = "A<boi>B<boi>";
  expands_to(&mm, t, 2, NULL, "A\n\n<boi><s><s><s><eoi>\n\nB\n\n<boi><s><s><s><eoi>\n\n");
  char *out = NULL, err[256] = "";
  size_t n = 0;
  TH_CHECK_EQ_INT(fe_mm_expand(&mm, t, strlen(t), 1, NULL, &out, &n, err, sizeof(err)),
                  CM_ERR_INVAL);
  TH_CHECK(strstr(err, "2 image placeholders (<boi>) for 1 image") != NULL);
  TH_CHECK(out == NULL);
  TH_CHECK_EQ_INT(fe_mm_expand(&mm, "no marker", 9, 1, NULL, &out, &n, err, sizeof(err)),
                  CM_ERR_INVAL);
  TH_REQUIRE(fe_mm_expand(&mm, "plain", 5, 0, NULL, &out, &n, err, sizeof(err)) == 0);
  TH_CHECK_EQ_STR(out, "plain");
  free(out);
}

TH_TEST(find_runs) {
  struct fe_mm mm;
  small_mm(&mm);
  struct pr_image im[3] = {0};
  char err[256];
  int32_t ids[] = {2, 5, 7, 7, 7, 6, 9, 7, 7, 7, 1};
  TH_REQUIRE(fe_mm_find_runs(&mm, ids, 11, im, 2, NULL, err, sizeof(err)) == 0);
  TH_CHECK(im[0].pos == 2 && im[0].n_tokens == 3 && im[1].pos == 7 && im[1].n_tokens == 3);
  TH_CHECK_EQ_INT(fe_mm_find_runs(&mm, ids, 11, im, 1, NULL, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(fe_mm_find_runs(&mm, ids, 11, im, 3, NULL, err, sizeof(err)), CM_ERR_INVAL);
  int32_t short_run[] = {2, 7, 7, 1}; /* a run of 2 where images take 3 */
  TH_CHECK_EQ_INT(fe_mm_find_runs(&mm, short_run, 4, im, 1, NULL, err, sizeof(err)), CM_ERR_INVAL);
  int32_t long_run[] = {7, 7, 7, 7};
  TH_CHECK_EQ_INT(fe_mm_find_runs(&mm, long_run, 4, im, 1, NULL, err, sizeof(err)), CM_ERR_INVAL);
}

/* Gemma 4 (Gemma4Processor.replace_image_token): the template's marker is the
 * image token itself, each becomes <|image> + N x <|image|> + <image|> with
 * the image's own N and nothing around it; runs are checked per image. */
TH_TEST(expand_and_find_gemma4) {
  struct fe_mm mm;
  g4_mm(&mm);
  const char *t = "A<|image|>B<|image|>";
  const int tokens[2] = {2, 1};
  expands_to(&mm, t, 2, tokens, "A<|image><|image|><|image|><image|>B<|image><|image|><image|>");
  char *out = NULL, err[256] = "";
  size_t n = 0;
  TH_CHECK_EQ_INT(fe_mm_expand(&mm, "<|image>x", 9, 1, tokens, &out, &n, err, sizeof(err)),
                  CM_ERR_INVAL);
  struct pr_image im[2] = {0};
  int32_t ids[] = {2, 8, 7, 7, 9, 5, 8, 7, 9};
  TH_REQUIRE(fe_mm_find_runs(&mm, ids, 9, im, 2, tokens, err, sizeof(err)) == 0);
  TH_CHECK(im[0].pos == 2 && im[0].n_tokens == 2 && im[1].pos == 7 && im[1].n_tokens == 1);
  const int swapped[2] = {1, 2};
  TH_CHECK_EQ_INT(fe_mm_find_runs(&mm, ids, 9, im, 2, swapped, err, sizeof(err)), CM_ERR_INVAL);
}

/* Gemma 4's audio (Gemma4Processor.replace_audio_token): <|audio|> becomes
 * <|audio> + N x <|audio|> + <audio|>, N the clip's own; with images in the
 * same prompt each kind's markers and runs are its own, in prompt order. */
TH_TEST(expand_and_find_audio) {
  struct fe_mm mm;
  g4_mm(&mm);
  mm.audio = 1;
  mm.audio_id = 11;
  strcpy(mm.boa, "<|audio>");
  strcpy(mm.audio_soft, "<|audio|>");
  strcpy(mm.eoa, "<audio|>");
  char *out = NULL, *out2 = NULL, err[256] = "";
  size_t n = 0, n2 = 0;
  const char *t = "A<|audio|>B<|image|>C<|audio|>";
  const int clip_tokens[2] = {3, 1}, img_tokens[1] = {2};
  TH_REQUIRE(fe_mm_expand(&mm, t, strlen(t), 1, img_tokens, &out, &n, err, sizeof(err)) == 0);
  TH_REQUIRE(fe_mm_expand_audio(&mm, out, n, 2, clip_tokens, &out2, &n2, err, sizeof(err)) == 0);
  TH_CHECK_EQ_STR(out2, "A<|audio><|audio|><|audio|><|audio|><audio|>B<|image><|image|><|image|>"
                        "<image|>C<|audio><|audio|><audio|>");
  TH_CHECK(n2 == strlen(out2));
  free(out);
  free(out2);
  TH_CHECK_EQ_INT(fe_mm_expand_audio(&mm, t, strlen(t), 1, clip_tokens, &out, &n, err, sizeof(err)),
                  CM_ERR_INVAL);
  TH_CHECK(strstr(err, "2 audio clip placeholders (<|audio|>) for 1 audio clip") != NULL);
  /* ids: <bos> <|audio> 11 11 11 <audio|> <|image> 7 7 <image|> <|audio> 11 <audio|> */
  int32_t ids[] = {2, 12, 11, 11, 11, 13, 8, 7, 7, 9, 12, 11, 13};
  struct pr_image im[3] = {
      {.kind = PR_MEDIA_AUDIO}, {.kind = PR_MEDIA_IMAGE}, {.kind = PR_MEDIA_AUDIO}};
  const int tokens[3] = {3, 2, 1};
  TH_REQUIRE(fe_mm_find_runs(&mm, ids, 13, im, 3, tokens, err, sizeof(err)) == 0);
  TH_CHECK(im[0].pos == 2 && im[0].n_tokens == 3 && im[1].pos == 7 && im[1].n_tokens == 2 &&
           im[2].pos == 11 && im[2].n_tokens == 1);
  /* the items' kinds out of the prompt's order: refused, naming what is wrong */
  im[0].kind = PR_MEDIA_IMAGE;
  im[1].kind = PR_MEDIA_AUDIO;
  TH_CHECK_EQ_INT(fe_mm_find_runs(&mm, ids, 13, im, 3, tokens, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(strstr(err, "audio tokens do not match") != NULL);
  /* a clip whose run is not its token count */
  im[0].kind = PR_MEDIA_AUDIO;
  im[1].kind = PR_MEDIA_IMAGE;
  const int off[3] = {2, 2, 1};
  TH_CHECK_EQ_INT(fe_mm_find_runs(&mm, ids, 13, im, 3, off, err, sizeof(err)), CM_ERR_INVAL);
}

TH_TEST(limit_flag) {
  int n = -1, a = -1;
  char err[160];
  TH_CHECK(fe_mm_parse_limit("image=3", &n, &a, err, sizeof(err)) == 0 && n == 3 && a == -1);
  TH_CHECK(fe_mm_parse_limit("{\"image\": 0}", &n, &a, err, sizeof(err)) == 0 && n == 0);
  TH_CHECK(fe_mm_parse_limit("audio=2", &n, &a, err, sizeof(err)) == 0 && n == 0 && a == 2);
  TH_CHECK(fe_mm_parse_limit("image=4,audio=1", &n, &a, err, sizeof(err)) == 0 && n == 4 && a == 1);
  TH_CHECK(fe_mm_parse_limit("{\"image\": 2, \"audio\": 0}", &n, &a, err, sizeof(err)) == 0 &&
           n == 2 && a == 0);
  TH_CHECK(fe_mm_parse_limit("image=", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  TH_CHECK(fe_mm_parse_limit("image=-1", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  TH_CHECK(fe_mm_parse_limit("image=65", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  TH_CHECK(fe_mm_parse_limit("audio=65", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  TH_CHECK(fe_mm_parse_limit("image=2x", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  TH_CHECK(fe_mm_parse_limit("image=2,", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  TH_CHECK(fe_mm_parse_limit("video=1", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  TH_CHECK(strstr(err, "video") != NULL);
  TH_CHECK(fe_mm_parse_limit("{\"image\": 1, \"video\": 1}", &n, &a, err, sizeof(err)) ==
           CM_ERR_INVAL);
  TH_CHECK(fe_mm_parse_limit("{\"image\": \"2\"}", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  TH_CHECK(fe_mm_parse_limit("{}", &n, &a, err, sizeof(err)) == CM_ERR_INVAL);
  /* a refused spec changes neither */
  TH_CHECK(n == 2 && a == 0);
}
