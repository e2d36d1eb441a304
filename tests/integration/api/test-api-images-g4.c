/* test-api-images-g4.c — Gemma 4 image input through the OpenAI API on the
 * tiny Gemma 4 with a vision tower (make-tiny-model --arch gemma4 --vision
 * --bidir-vision --chat-format gemma4: 2 tower layers of 32, standardisation,
 * clipped linears, the image mask on), two servers side by side:
 *   A: the default step budget (prompts in one chunk);
 *   B: --max-num-batched-tokens 100 (prompts in chunks whose ends the
 *      scheduler moves out of the images: a 70-token budget image and its
 *      markers fit one step, the text around it does not).
 * Checked:
 *   (a) the prompt is the text's tokens plus, per image, <|image> + N x
 *       <|image|> + <image|> (ids from config.json, N from the image's size
 *       for its budget, md_g4_image_plan): usage.prompt_tokens and /tokenize;
 *   (b) greedy output at temperature 0 is the same twice, on A and B, two
 *       images of different sizes in one prompt, streamed or not; and it is
 *       the offline path's: this process loads the same checkpoint on the
 *       CPU backend, preprocesses the same pixels (md_g4_image_preprocess),
 *       encodes them (wk_vision_g4_encode), writes the rows over the soft
 *       tokens with each image's bidirectional range and decodes greedily
 *       with wk_model_forward; the tokens (as the logprobs' bytes) agree;
 *   (b') a third server, C, on a Gemma 4 checkpoint served from the GGUF
 *       files export-gguf writes (the model file and llama.cpp's mmproj file):
 *       its answers with one image and two are the offline path's on the
 *       safetensors checkpoint;
 *   (c) an unsupported max_soft_tokens is a 400 naming
 *       mm_processor_kwargs.max_soft_tokens, a broken image a 400 naming its
 *       part, and the server serves on. */
#include <jansson.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-config.h"
#include "model/md-vision-g4.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-greedy.h"
#include "tests/integration/api/api-images.h"
#include "tests/integration/api/api-serve.h"
#include "tokenizer/tk-tokenizer.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"
#include "worker/wk-vision-g4.h"

#define PART(k) "messages[0].content[" #k "].image_url"

/* ---- images ------------------------------------------------------------------- */

/* A test picture: rgb[h, w, 3] (malloc'd) and its PNG (malloc'd, *n bytes). */
static uint8_t *picture(int kind, int w, int h, uint8_t **png_out, size_t *n) {
  uint8_t *rgb = api_picture_rgb(kind, w, h);
  *png_out = api_png_encode(rgb, w, h, n);
  return rgb;
}

static char *data_url(const uint8_t *p, size_t n) {
  return api_data_url(p, n);
}

/* ---- requests ------------------------------------------------------------------ */

/* A user message: text, an image per url, more text; budget 0: no
 * mm_processor_kwargs; budget < 0: max_soft_tokens "x". */
static char *chat_body(const char *before, const char *const urls[], int n_urls, const char *after,
                       int budget, int stream) {
  json_t *parts = api_image_parts(before, urls, n_urls, after);
  json_t *kw = budget > 0   ? json_pack("{s:i}", "max_soft_tokens", budget)
               : budget < 0 ? json_pack("{s:s}", "max_soft_tokens", "x")
                            : NULL;
  return api_greedy_body(parts, kw, stream);
}

/* ---- the offline path ------------------------------------------------------------ */

struct image {
  const uint8_t *rgb;
  int w, h;
};

/* Greedy tokens of ids[0..n) with the images (in prompt order, at the runs
 * of image_id) written over their soft tokens, each with its bidirectional
 * range, on the CPU backend. out[API_GEN]. */
static void offline_greedy(const char *dir, const int32_t *ids, int n, const struct image *ims,
                           int n_ims, int budget, int32_t *out) {
  char err[512] = "";
  struct api_offline o;
  api_offline_open(&o, dir, n);
  struct wk_vision_g4 *v = NULL;
  if (wk_vision_g4_load(dir, o.be, NULL, &v, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "vision tower: %s", err);
    th_stop();
  }
  const struct md_vision_g4_cfg *vc = wk_vision_g4_config(v);
  int H = wk_model_config(o.m)->hidden;
  /* the images' rows, and where their runs are */
  struct wk_seq_embed emb[4];
  int32_t ranges[4][2];
  float *rows[4] = {0};
  TH_REQUIRE(n_ims <= 4);
  int at = 0;
  for (int i = 0; i < n_ims; i++) {
    struct md_g4_image info;
    TH_REQUIRE(md_g4_image_plan(&info, ims[i].w, ims[i].h, vc, budget, err, sizeof(err)) == 0);
    float *px = malloc(sizeof(float) * (size_t)info.max_patches * (size_t)info.patch_dim);
    int32_t *pos = malloc(sizeof(int32_t) * 2 * (size_t)info.max_patches);
    rows[i] = malloc(sizeof(float) * (size_t)info.soft_tokens * (size_t)H);
    TH_REQUIRE(px && pos && rows[i]);
    TH_REQUIRE(md_g4_image_preprocess(px, pos, &info, ims[i].rgb, ims[i].w, ims[i].h, vc, budget,
                                      err, sizeof(err)) == 0);
    struct wk_g4_image im = {px, pos, info};
    if (wk_vision_g4_encode(v, &im, 1, rows[i], err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "encode: %s", err);
      th_stop();
    }
    free(px);
    free(pos);
    while (at < n && ids[at] != vc->image_id)
      at++;
    TH_REQUIRE(at + info.soft_tokens <= n);
    emb[i] = (struct wk_seq_embed){.pos = at, .n = info.soft_tokens, .rows = rows[i]};
    ranges[i][0] = at;
    ranges[i][1] = at + info.soft_tokens;
    at += info.soft_tokens;
  }
  api_offline_greedy(&o, ids, n, emb, n_ims, &ranges[0][0], n_ims, out);
  for (int i = 0; i < n_ims; i++)
    free(rows[i]);
  wk_vision_g4_free(v);
  api_offline_close(&o);
}

/* ---- the test ------------------------------------------------------------------ */

#define TEXT "Here is a picture of something, and a question about it. Look at this:"

TH_TEST(gemma4_images_through_the_api) {
  th_proc_init(900);
  struct as_server a = {.vision_g4 = 1}, b = {.vision_g4 = 1};
  as_start(&a, 0, NULL);
  as_start(&b, 0, (char *[]){"--max-num-batched-tokens", "100", NULL});

  /* the image ids and the tower, from the checkpoint */
  struct md_config *cfg = calloc(1, sizeof(*cfg));
  char err[512];
  TH_REQUIRE(cfg && md_config_load(a.model, cfg, err, sizeof(err)) == 0);
  const struct md_vision_g4_cfg *vc = &cfg->vision_g4;
  TH_REQUIRE(vc->present && vc->bidir == 1);

  uint8_t *png0, *png1;
  size_t n0, n1;
  struct image im0 = {picture(0, 40, 30, &png0, &n0), 40, 30};
  struct image im1 = {picture(1, 64, 64, &png1, &n1), 64, 64};
  char *u0 = data_url(png0, n0), *u1 = data_url(png1, n1);

  /* (a) the prompt: text + per image <|image> N x <|image|> <image|> */
  int budgets[2] = {0, 70};
  for (int bi = 0; bi < 2; bi++) {
    int budget = budgets[bi];
    struct md_g4_image p0, p1;
    TH_REQUIRE(md_g4_image_plan(&p0, 40, 30, vc, budget, err, sizeof(err)) == 0);
    TH_REQUIRE(md_g4_image_plan(&p1, 64, 64, vc, budget, err, sizeof(err)) == 0);
    TH_CHECK(p0.soft_tokens != p1.soft_tokens || budget == 0);
    /* the images last: special tokens on both sides of each run, so that the
     * text's tokens are the same with them and without */
    char *text_only = chat_body(TEXT, NULL, 0, NULL, 0, 0);
    char *two = chat_body(TEXT, (const char *[]){u0, u1}, 2, NULL, budget, 0);
    struct api_answer r;
    api_check_prompt(&a, text_only, two, vc->boi_id, vc->image_id, vc->eoi_id,
                     (const int[]){p0.soft_tokens, p1.soft_tokens}, 2, &r);
    fprintf(stderr, "budget %d: %d + %d soft tokens, %d prompt tokens: '%s'\n", budget,
            p0.soft_tokens, p1.soft_tokens, r.prompt_tokens, r.text);
    free(text_only);
    free(two);
  }

  /* (b) deterministic, the same chunked (B), streamed, and the offline path's */
  char *one = chat_body(TEXT, (const char *[]){u0}, 1, "What is in it?", 70, 0);
  char *two = chat_body(TEXT, (const char *[]){u0, u1}, 2, "Which is brighter?", 70, 0);
  char *two_s = chat_body(TEXT, (const char *[]){u0, u1}, 2, "Which is brighter?", 70, 1);
  char *other = chat_body(TEXT, (const char *[]){u1}, 1, "What is in it?", 70, 0);
  struct api_answer a1, a2;
  api_check_deterministic(&a, &b, one, two, two_s, other, &a1, &a2);
  free(other);
  TH_CHECK(a2.prompt_tokens > 100); /* B ran it in chunks */
  {
    const char *bodies[2] = {one, two};
    const struct api_answer *want[2] = {&a1, &a2};
    struct image ims[2] = {im0, im1};
    for (int q = 0; q < 2; q++) {
      int n = 0;
      int32_t *ids = api_tokenize(&a, bodies[q], &n);
      int32_t gen[API_GEN];
      offline_greedy(a.model, ids, n, ims, q + 1, 70, gen);
      api_check_tokens(a.model, gen, want[q], q ? "two images" : "one image");
      free(ids);
    }
  }

  /* C: a Gemma 4 checkpoint served from the GGUF files export-gguf writes (the
     model file, and llama.cpp's mmproj file with the vision and audio towers:
     --model g/model.gguf --mmproj mmproj-model-f16.gguf); its answers with one
     image and with two are the offline path's on the safetensors checkpoint */
  {
    struct as_server c = {.audio = 1, .audio_defaults = 1, .gguf = 1};
    as_start(&c, 0, NULL);
    char ck[300];
    snprintf(ck, sizeof(ck), "%s/m", c.dir);
    const char *bodies[2] = {one, two};
    struct image ims[2] = {im0, im1};
    for (int q = 0; q < 2; q++) {
      struct api_answer got;
      api_chat(&c, bodies[q], &got);
      fprintf(stderr, "GGUF + mmproj, %d image(s): %d prompt tokens, '%s'\n", q + 1,
              got.prompt_tokens, got.text);
      int n = 0;
      int32_t *ids = api_tokenize(&c, bodies[q], &n);
      TH_CHECK_EQ_INT(n, got.prompt_tokens);
      int32_t gen[API_GEN];
      offline_greedy(ck, ids, n, ims, q + 1, 70, gen);
      api_check_tokens(ck, gen, &got, q ? "GGUF, two images" : "GGUF, one image");
      free(ids);
    }
    as_stop(&c);
  }

  /* (c) bad input: 400s naming the field or the part; both servers go on */
  {
    char *bad = chat_body(TEXT, (const char *[]){u0}, 1, NULL, 100, 0);
    api_refused(&a, bad, "mm_processor_kwargs.max_soft_tokens");
    free(bad);
    bad = chat_body(TEXT, (const char *[]){u0}, 1, NULL, -1, 0);
    api_refused(&a, bad, "mm_processor_kwargs.max_soft_tokens");
    free(bad);
    char *trunc = data_url(png0, n0 * 3 / 5);
    bad = chat_body("Look:", (const char *[]){trunc}, 1, NULL, 0, 0);
    api_refused(&b, bad, PART(1));
    free(bad);
    bad = chat_body("Look:", (const char *[]){"data:image/png;base64,AAAA"}, 1, NULL, 70, 0);
    api_refused(&a, bad, PART(1));
    free(bad);
    free(trunc);
    /* the default budget (280 soft tokens) does not fit B's 100-token steps */
    bad = chat_body(TEXT, (const char *[]){u1}, 1, NULL, 0, 0);
    struct as_resp r;
    as_post(&b, "/v1/chat/completions", bad, &r);
    TH_CHECK(r.status == 400);
    as_resp_free(&r);
    free(bad);
    api_check_both(&a, &b, two, &a2);
  }

  /* (d) --mm-processor-kwargs (vLLM's): the budget of the requests that name none; one
   * that names its own keeps it */
  {
    struct as_server d = {.vision_g4 = 1};
    as_start(&d, 0, (char *[]){"--mm-processor-kwargs", "{\"max_soft_tokens\": 70}", NULL});
    char *plain = chat_body(TEXT, (const char *[]){u1}, 1, NULL, 0, 0);
    char *b70 = chat_body(TEXT, (const char *[]){u1}, 1, NULL, 70, 0);
    char *b280 = chat_body(TEXT, (const char *[]){u1}, 1, NULL, 280, 0);
    int n_d = 0, n_a70 = 0, n_d280 = 0, n_a = 0;
    int32_t *ids_d = api_tokenize(&d, plain, &n_d), *ids_a70 = api_tokenize(&a, b70, &n_a70);
    int32_t *ids_d280 = api_tokenize(&d, b280, &n_d280), *ids_a = api_tokenize(&a, plain, &n_a);
    struct md_g4_image p70, p280;
    TH_REQUIRE(md_g4_image_plan(&p70, 64, 64, vc, 70, err, sizeof(err)) == 0);
    TH_REQUIRE(md_g4_image_plan(&p280, 64, 64, vc, 280, err, sizeof(err)) == 0);
    TH_CHECK(p70.soft_tokens != p280.soft_tokens);
    TH_CHECK_EQ_INT(n_d, n_a70);
    TH_CHECK(n_d == n_a70 && !memcmp(ids_d, ids_a70, sizeof(int32_t) * (size_t)n_d));
    TH_CHECK_EQ_INT(n_d280, n_a);
    TH_CHECK_EQ_INT(n_a - n_d, p280.soft_tokens - p70.soft_tokens);
    free(ids_d), free(ids_a70), free(ids_d280), free(ids_a);
    free(plain), free(b70), free(b280);
    as_stop(&d);
  }

  free(one);
  free(two);
  free(two_s);
  free(u0), free(u1);
  free(png0), free(png1);
  free((void *)im0.rgb), free((void *)im1.rgb);
  free(cfg);
  as_stop(&a);
  as_stop(&b);
}
