/* test-api-images.c — image input through the OpenAI API on a tiny Gemma 3
 * with a vision tower (make-tiny-model --arch gemma3 --vision: 64 px images,
 * 16 soft tokens each), two servers side by side:
 *   A: the default step budget (prompts in one chunk), file:// allowed under a
 *      folder;
 *   B: --max-num-batched-tokens 24 (prompts in chunks whose ends the
 *      scheduler moves out of the images), --limit-mm-per-prompt image=2;
 * and C, the same checkpoint as a GGUF file with llama.cpp's mmproj file
 * (export-gguf --mmproj; serve --mmproj), and D, its model file's vocabulary
 * cut as llama.cpp's converter cuts it: both answer as A does.
 * Greedy output for prompts with one and with two images is the same on both,
 * alone or batched with text-only requests, from a prefix-cache hit or miss;
 * a different image behind the same text shares only the text's blocks;
 * usage counts the image tokens; file:// works only inside the allowed
 * folder; every bad image is a 400 naming its part and the server goes on;
 * and the official openai client sends an image (api-openai-images.mjs). */
#include <jansson.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "tests/harness/th-gguf.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-greedy.h"
#include "tests/integration/api/api-images.h"
#include "tests/integration/api/api-serve.h"

#define IMAGE_TOKEN 262144
#define SOFT_TOKENS 16
#define PART(k)     "messages[0].content[" #k "].image_url"

/* ---- images ------------------------------------------------------------------- */

/* Test pictures' PNGs (api_picture_rgb's kinds; malloc'd, *n bytes). */
static uint8_t *picture(int kind, int w, int h, size_t *n) {
  uint8_t *rgb = api_picture_rgb(kind, w, h), *png = api_png_encode(rgb, w, h, n);
  free(rgb);
  return png;
}

static char *data_url(const uint8_t *p, size_t n) {
  return api_data_url(p, n);
}

/* A PNG signature and IHDR declaring w x h RGB pixels, then an empty IEND:
 * what a decompression bomb's header looks like (or a zero-size image). */
static char *png_header_url(uint32_t w, uint32_t h) {
  uint8_t b[64];
  size_t n = 0;
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  memcpy(b, sig, 8);
  n = 8;
  uint8_t ihdr[17] = {'I',
                      'H',
                      'D',
                      'R',
                      (uint8_t)(w >> 24),
                      (uint8_t)(w >> 16),
                      (uint8_t)(w >> 8),
                      (uint8_t)w,
                      (uint8_t)(h >> 24),
                      (uint8_t)(h >> 16),
                      (uint8_t)(h >> 8),
                      (uint8_t)h,
                      8,
                      2,
                      0,
                      0,
                      0};
  b[n++] = 0, b[n++] = 0, b[n++] = 0, b[n++] = 13;
  memcpy(b + n, ihdr, 17);
  n += 17;
  uint32_t c = (uint32_t)crc32(0, ihdr, 17);
  b[n++] = (uint8_t)(c >> 24), b[n++] = (uint8_t)(c >> 16), b[n++] = (uint8_t)(c >> 8);
  b[n++] = (uint8_t)c;
  static const uint8_t iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
  memcpy(b + n, iend, 12);
  n += 12;
  return data_url(b, n);
}

/* ---- requests ------------------------------------------------------------------ */

/* A user message: text, then an image per url, then more text. */
static char *chat_body(const char *before, const char *const urls[], int n_urls,
                       const char *after) {
  json_t *parts = api_image_parts(before, urls, n_urls, after);
  json_t *b = json_pack("{s:[{s:s, s:o}], s:i, s:f, s:b}", "messages", "role", "user", "content",
                        parts, "max_tokens", 8, "temperature", 0.0, "ignore_eos", 1);
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  TH_REQUIRE(s != NULL);
  return s;
}

/* The greedy text of a chat answer and its prompt_tokens; fails the test on
 * anything but a 200. */
static void answer_of(const struct as_resp *r, char *text, size_t size, int *prompt_tokens) {
  if (r->status != 200) fprintf(stderr, "answer %d: %s\n", r->status, r->body ? r->body : "");
  TH_REQUIRE(r->status == 200);
  json_t *j = as_json(r);
  TH_REQUIRE(j != NULL);
  json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
  const char *c = json_string_value(json_object_get(msg, "content"));
  TH_REQUIRE(c != NULL);
  snprintf(text, size, "%s", c);
  json_t *u = json_object_get(j, "usage");
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), 8);
  if (prompt_tokens) *prompt_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
  json_decref(j);
}

static void chat(const struct as_server *s, const char *body, char *text, size_t size,
                 int *prompt_tokens) {
  struct as_resp r;
  as_post(s, "/v1/chat/completions", body, &r);
  answer_of(&r, text, size, prompt_tokens);
  as_resp_free(&r);
}

/* POSTs the JSON object b (taken over) to path on s: the 200 answer's JSON. */
static json_t *post_json(const struct as_server *s, const char *path, json_t *b) {
  char *body = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  TH_REQUIRE(body != NULL);
  struct as_resp r;
  as_post(s, path, body, &r);
  free(body);
  TH_REQUIRE(r.status == 200);
  json_t *j = as_json(&r);
  as_resp_free(&r);
  return j;
}

/* A request that must be refused: 400 naming `param`, the message holding `want`. */
static void refused(const struct as_server *s, const char *body, const char *param,
                    const char *want) {
  struct as_resp r;
  as_post(s, "/v1/chat/completions", body, &r);
  as_check_error(&r, 400, param);
  if (want && (!r.body || !strstr(r.body, want)))
    th_fail(__FILE__, __LINE__, "the error does not say '%s': %s", want, r.body ? r.body : "");
  as_resp_free(&r);
}

/* The model file cut to tokenizer.model's 262144 pieces, as llama.cpp's
 * converter writes Gemma 3's. */
static void cut_vocab(struct as_server *s) {
  th_gguf_cut_vocab(s->model, s->model, 262144);
}

/* ---- the test ------------------------------------------------------------------ */

#define LONG_TEXT                                                                                  \
  "Here is a long preamble so that several whole KV blocks come before the picture: the "          \
  "quick brown fox jumps over the lazy dog, again and again, while the river runs to the sea "     \
  "and the clocks strike the hours one after another. Look at this:"

TH_TEST(images_through_the_api) {
  th_proc_init(900);
  char media[300];
  TH_REQUIRE(th_tmpdir("media", media, sizeof(media)) == 0);

  struct as_server a = {.vision = 1}, b = {.vision = 1};
  as_start(&a, 0, (char *[]){"--allowed-local-media-path", media, NULL});
  as_start(&b, 0,
           (char *[]){"--max-num-batched-tokens", "24", "--limit-mm-per-prompt", "image=2", NULL});

  size_t n0, n1, n2;
  uint8_t *p0 = picture(0, 40, 30, &n0); /* resized to 64 x 64 */
  uint8_t *p1 = picture(1, 64, 64, &n1); /* already the model's size */
  uint8_t *p2 = picture(2, 40, 30, &n2); /* p0 inverted */
  char *u0 = data_url(p0, n0), *u1 = data_url(p1, n1), *u2 = data_url(p2, n2);

  /* one image, then two: the same greedy text whole (A) and chunked (B) */
  char *one = chat_body(LONG_TEXT, (const char *[]){u0}, 1, "What is in it?");
  char *two = chat_body("Compare", (const char *[]){u0, u1}, 2, "Which is brighter?");
  char ta1[512], tb1[512], ta2[512], tb2[512];
  int pa1, pb1, pa2, pb2;
  chat(&a, one, ta1, sizeof(ta1), &pa1);
  chat(&b, one, tb1, sizeof(tb1), &pb1);
  chat(&a, two, ta2, sizeof(ta2), &pa2);
  chat(&b, two, tb2, sizeof(tb2), &pb2);
  TH_CHECK_EQ_STR(ta1, tb1);
  TH_CHECK_EQ_STR(ta2, tb2);
  TH_CHECK_EQ_INT(pa1, pb1);
  TH_CHECK_EQ_INT(pa2, pb2);

  /* the Responses API's input_image parts: the chat answer's text and prompt */
  {
    json_t *rb = json_pack(
        "{s:[{s:s, s:[{s:s, s:s}, {s:s, s:s, s:s}, {s:s, s:s}]}], s:i, s:f, s:b}", "input", "role",
        "user", "content", "type", "input_text", "text", LONG_TEXT, "type", "input_image",
        "image_url", u0, "detail", "auto", "type", "input_text", "text", "What is in it?",
        "max_output_tokens", 8, "temperature", 0.0, "ignore_eos", 1);
    json_t *j = post_json(&a, "/v1/responses", rb);
    json_t *item = json_array_get(json_object_get(j, "output"), 0);
    json_t *part = json_array_get(json_object_get(item, "content"), 0);
    TH_CHECK_EQ_STR(json_string_value(json_object_get(part, "text")), ta1);
    TH_CHECK_EQ_INT(as_jint(j, "usage", "input_tokens"), pa1);
    json_decref(j);
  }

  /* Anthropic's Messages API's image block (a base64 source): the same text and prompt */
  {
    const char *data = strstr(u0, "base64,") + 7;
    json_t *mb = json_pack(
        "{s:s, s:[{s:s, s:[{s:s, s:s}, {s:s, s:{s:s, s:s, s:s}}, {s:s, s:s}]}], s:i, s:f, s:b}",
        "model", a.model, "messages", "role", "user", "content", "type", "text", "text", LONG_TEXT,
        "type", "image", "source", "type", "base64", "media_type", "image/png", "data", data,
        "type", "text", "text", "What is in it?", "max_tokens", 8, "temperature", 0.0, "ignore_eos",
        1);
    json_t *j = post_json(&a, "/v1/messages", mb);
    json_t *blk = json_array_get(json_object_get(j, "content"), 0);
    TH_CHECK_EQ_STR(json_string_value(json_object_get(blk, "text")), ta1);
    TH_CHECK_EQ_INT(
        as_jint(j, "usage", "input_tokens") + as_jint(j, "usage", "cache_read_input_tokens"), pa1);
    json_decref(j);
  }

  /* C: the same checkpoint as a GGUF file, the tower in llama.cpp's mmproj
     file named by --mmproj (f16 matrices: the bf16 weights' own values); D:
     its model file as llama.cpp's converter cuts it (no <image_soft_token>
     in the vocabulary: <unused0> stands in). The same answers. */
  for (int k = 0; k < 2; k++) {
    struct as_server c = {.vision = 1, .gguf = 1, .prepare = k ? cut_vocab : NULL};
    as_start(&c, 0, NULL);
    char tc[512];
    int pc;
    chat(&c, one, tc, sizeof(tc), &pc);
    TH_CHECK_EQ_STR(tc, ta1);
    TH_CHECK_EQ_INT(pc, pa1);
    chat(&c, two, tc, sizeof(tc), &pc);
    TH_CHECK_EQ_STR(tc, ta2);
    TH_CHECK_EQ_INT(pc, pa2);
    as_stop(&c);
  }

  /* usage counts the image tokens: as many as /tokenize gives, each image's run
   * "\n\n<start_of_image>" + 16 soft tokens + "<end_of_image>\n\n" in place */
  int n_ids = 0;
  int32_t *ids = api_tokenize(&a, two, &n_ids);
  TH_CHECK_EQ_INT(n_ids, pa2);
  int runs = 0, soft = 0, first_soft = -1;
  for (int i = 0; i < n_ids; i++) {
    if (ids[i] != IMAGE_TOKEN) continue;
    soft++;
    if (i == 0 || ids[i - 1] != IMAGE_TOKEN) runs++;
  }
  TH_CHECK_EQ_INT(runs, 2);
  TH_CHECK_EQ_INT(soft, 2 * SOFT_TOKENS);
  free(ids);
  ids = api_tokenize(&a, one, &n_ids);
  for (int i = 0; i < n_ids && first_soft < 0; i++)
    if (ids[i] == IMAGE_TOKEN) first_soft = i;
  TH_CHECK(first_soft > 32); /* two whole 16-token blocks of text before the image */
  free(ids);

  /* alone vs batched with text-only requests (B: chunks of 24 tokens shared) */
  {
    char *t1 = chat_body("Write a poem about the sea and its many moods.", NULL, 0, NULL);
    char *t2 = chat_body("List the planets.", NULL, 0, NULL);
    const char *paths[4] = {"/v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions",
                            "/v1/chat/completions"};
    const char *bodies[4] = {t1, two, t2, one};
    struct as_resp r[4];
    TH_CHECK_EQ_INT(as_post_many(&b, 4, paths, bodies, r), 4);
    char t[512];
    answer_of(&r[1], t, sizeof(t), NULL);
    TH_CHECK_EQ_STR(t, tb2);
    answer_of(&r[3], t, sizeof(t), NULL);
    TH_CHECK_EQ_STR(t, tb1);
    for (int i = 0; i < 4; i++)
      as_resp_free(&r[i]);
    free(t1);
    free(t2);
  }

  /* prefix cache: the same request again is a hit with the same text; the same
   * text with another image hits only the blocks before the image */
  {
    const char *hits = "lmserve:prefix_cache_hits_total";
    double h0 = as_metric(&a, hits);
    TH_REQUIRE(h0 == h0);
    char t[512];
    chat(&a, one, t, sizeof(t), NULL);
    TH_CHECK_EQ_STR(t, ta1);
    double h1 = as_metric_wait_min(&a, hits, h0 + 16, 5000);
    TH_CHECK(h1 >= h0 + (pa1 - 1) / 16 * 16 - 16); /* the whole prompt but its last block */
    char *other = chat_body(LONG_TEXT, (const char *[]){u2}, 1, "What is in it?");
    char ta3[512], tb3[512];
    chat(&a, other, ta3, sizeof(ta3), NULL);
    double h2 = as_metric_wait_min(&a, hits, h1 + 16, 5000);
    TH_CHECK(h2 - h1 >= 16);
    TH_CHECK(h2 - h1 <= first_soft);         /* nothing at or after the image's first token */
    chat(&b, other, tb3, sizeof(tb3), NULL); /* B has never seen it: a miss */
    TH_CHECK_EQ_STR(ta3, tb3);
    /* and the image is read: another picture behind the same words answers otherwise
     * (the seeded tiny model's greedy texts for the two differ) */
    TH_CHECK(strcmp(ta3, ta1) != 0);
    free(other);
  }

  /* file:// under --allowed-local-media-path (A), refused elsewhere and on B */
  {
    char path[400], url[420], link[400], lurl[420];
    snprintf(path, sizeof(path), "%s/pic.png", media);
    FILE *f = fopen(path, "wb");
    TH_REQUIRE(f && fwrite(p0, 1, n0, f) == n0);
    fclose(f);
    snprintf(url, sizeof(url), "file://%s", path);
    char *fb = chat_body(LONG_TEXT, (const char *[]){url}, 1, "What is in it?");
    char t[512];
    chat(&a, fb, t, sizeof(t), NULL);
    TH_CHECK_EQ_STR(t, ta1);
    refused(&b, fb, PART(1), "allowed-local-media-path");
    free(fb);
    snprintf(link, sizeof(link), "%s/escape.png", media);
    TH_REQUIRE(symlink("/etc/hostname", link) == 0);
    snprintf(lurl, sizeof(lurl), "file://%s", link);
    fb = chat_body("x", (const char *[]){lurl}, 1, NULL);
    refused(&a, fb, PART(1), NULL);
    free(fb);
    fb = chat_body("x", (const char *[]){"file:///etc/hostname"}, 1, NULL);
    refused(&a, fb, PART(1), NULL);
    free(fb);
    unlink(link);
    unlink(path);
  }

  /* the bad-image matrix (B); each a 400 naming the part, and B goes on serving */
  {
    char *trunc = data_url(p0, n0 * 3 / 5);
    uint8_t junk[300];
    memcpy(junk, p0, 8); /* the PNG signature, then noise */
    for (size_t i = 8; i < sizeof(junk); i++)
      junk[i] = (uint8_t)(i * 131u + 7u);
    char *noise = data_url(junk, sizeof(junk));
    char *text = data_url((const uint8_t *)"plain text, not a picture", 25);
    char *bomb = png_header_url(100000, 100000), *zero = png_header_url(0, 16);
    const struct {
      const char *url, *want;
    } bad[] = {
        {trunc, NULL},
        {noise, NULL},
        {text, "unsupported image type"},
        {bomb, NULL},
        {zero, NULL},
        {"data:image/png;base64,iVBORw0K@@@", NULL},
        {"data:image/png,rawbytes", NULL},
        {"data:image/png;base64,", NULL},
        {"http://example.com/cat.png", "data:"},
        {"ftp://example.com/cat.png", NULL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
      char *body = chat_body("Look:", (const char *[]){bad[i].url}, 1, NULL);
      refused(&b, body, PART(1), bad[i].want);
      free(body);
    }
    char *three = chat_body("Three:", (const char *[]){u0, u1, u2}, 3, NULL);
    refused(&b, three, PART(3), "limit-mm-per-prompt");
    free(three);
    /* truncate_prompt_tokens: a cut before the image serves; one into it is a 400 */
    {
      char *one_img = chat_body("Look:", (const char *[]){u0}, 1, "What is in it?");
      char t[512], *cut = malloc(strlen(one_img) + 64);
      int n_all = 0, n_cut = 0;
      TH_REQUIRE(cut != NULL);
      chat(&b, one_img, t, sizeof(t), &n_all);
      snprintf(cut, strlen(one_img) + 64, "{\"truncate_prompt_tokens\":%d,%s", n_all - 2,
               one_img + 1);
      chat(&b, cut, t, sizeof(t), &n_cut);
      TH_CHECK_EQ_INT(n_cut, n_all - 2);
      snprintf(cut, strlen(one_img) + 64, "{\"truncate_prompt_tokens\":12,%s", one_img + 1);
      refused(&b, cut, "truncate_prompt_tokens", "images");
      free(cut);
      free(one_img);
    }
    refused(&b,
            "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
            "\"image_url\":{\"detail\":\"low\"}}]}]}",
            "messages[0].content[0]", NULL);
    refused(&b,
            "{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"image_url\","
            "\"image_url\":{\"url\":\"data:image/png;base64,AAAA\"}}]},"
            "{\"role\":\"user\",\"content\":\"hi\"}]}",
            "messages[0].content[0]", NULL);
    refused(&b,
            "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video_url\","
            "\"video_url\":{\"url\":\"x\"}}]}]}",
            "messages[0].content[0]", "image_url");
    free(trunc);
    free(noise);
    free(text);
    free(bomb);
    free(zero);
    char t[512];
    chat(&b, two, t, sizeof(t), NULL);
    TH_CHECK_EQ_STR(t, tb2);
  }

  /* the official client (node + node_modules/openai), when present */
  {
    char script[1024];
    snprintf(script, sizeof(script), "%s/integration/api/api-openai-images.mjs", th_tests_dir());
    if (th_node_major() < 20 || !th_npm_has("openai")) {
      fprintf(stderr, "SKIP (loudly): node >= 20 or node_modules/openai missing: the openai "
                      "client's image request did not run\n");
    } else {
      char e_url[96], e_img[400], e_text[600];
      snprintf(e_url, sizeof(e_url), "LMSERVE_URL=http://127.0.0.1:%d/v1", a.port);
      char *img_env = malloc(strlen(u1) + 32);
      TH_REQUIRE(img_env != NULL);
      sprintf(img_env, "LMSERVE_IMAGE=%s", u1);
      snprintf(e_img, sizeof(e_img), "LMSERVE_MODEL=%s", a.model); /* the served name */
      /* the expected greedy text of "Compare" [u0, u1] "Which is brighter?" */
      snprintf(e_text, sizeof(e_text), "LMSERVE_EXPECT=%s", ta2);
      char *u0_env = malloc(strlen(u0) + 32);
      TH_REQUIRE(u0_env != NULL);
      sprintf(u0_env, "LMSERVE_IMAGE0=%s", u0);
      char *env[] = {e_url, e_img, img_env, u0_env, e_text, "NO_COLOR=1", NULL};
      th_node_test(script, env, 300000);
      free(img_env);
      free(u0_env);
    }
  }

  free(one);
  free(two);
  free(u0), free(u1), free(u2);
  free(p0), free(p1), free(p2);
  as_stop(&a);
  as_stop(&b);
  rmdir(media);
}
