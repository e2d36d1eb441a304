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
#include "tests/integration/api/api-images.h"
#include "tests/integration/api/api-serve.h"
#include "tokenizer/tk-tokenizer.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"
#include "worker/wk-vision-g4.h"

#define N_GEN   8
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
  json_t *parts = json_array();
  json_array_append_new(parts, json_pack("{s:s, s:s}", "type", "text", "text", before));
  for (int i = 0; i < n_urls; i++)
    json_array_append_new(
        parts, json_pack("{s:s, s:{s:s}}", "type", "image_url", "image_url", "url", urls[i]));
  if (after) json_array_append_new(parts, json_pack("{s:s, s:s}", "type", "text", "text", after));
  json_t *b =
      json_pack("{s:[{s:s, s:o}], s:i, s:f, s:b, s:b}", "messages", "role", "user", "content",
                parts, "max_tokens", N_GEN, "temperature", 0.0, "ignore_eos", 1, "logprobs", 1);
  if (budget > 0)
    json_object_set_new(b, "mm_processor_kwargs", json_pack("{s:i}", "max_soft_tokens", budget));
  if (budget < 0)
    json_object_set_new(b, "mm_processor_kwargs", json_pack("{s:s}", "max_soft_tokens", "x"));
  if (stream) json_object_set_new(b, "stream", json_true());
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  TH_REQUIRE(s != NULL);
  return s;
}

/* One greedy answer: its text, prompt_tokens and each token's bytes. */
struct answer {
  char text[1024];
  int prompt_tokens;
  char tok[N_GEN][64]; /* the logprobs' bytes, NUL-terminated */
  int tok_len[N_GEN];
};

static void chat(const struct as_server *s, const char *body, struct answer *a) {
  struct as_resp r;
  memset(a, 0, sizeof(*a));
  as_post(s, "/v1/chat/completions", body, &r);
  if (r.status != 200) fprintf(stderr, "answer %d: %s\n", r.status, r.body ? r.body : "");
  TH_REQUIRE(r.status == 200);
  json_t *j = as_json(&r);
  TH_REQUIRE(j != NULL);
  json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  const char *c = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
  snprintf(a->text, sizeof(a->text), "%s", c ? c : "");
  json_t *u = json_object_get(j, "usage");
  TH_CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), N_GEN);
  a->prompt_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
  json_t *lp = json_object_get(json_object_get(ch, "logprobs"), "content");
  TH_CHECK_EQ_INT((int)json_array_size(lp), N_GEN);
  for (size_t i = 0; i < json_array_size(lp) && i < N_GEN; i++) {
    json_t *by = json_object_get(json_array_get(lp, i), "bytes");
    for (size_t k = 0; k < json_array_size(by) && k < 63; k++)
      a->tok[i][a->tok_len[i]++] = (char)json_integer_value(json_array_get(by, k));
  }
  json_decref(j);
  as_resp_free(&r);
}

/* /tokenize of a chat body's messages (and its mm_processor_kwargs): the ids
 * (malloc'd), *n of them. */
static int32_t *tokenize(const struct as_server *s, const char *body_json, int *n) {
  json_t *b = json_loads(body_json, 0, NULL);
  TH_REQUIRE(b != NULL);
  json_t *t = json_pack("{s:O}", "messages", json_object_get(b, "messages"));
  json_t *kw = json_object_get(b, "mm_processor_kwargs");
  if (kw) json_object_set(t, "mm_processor_kwargs", kw);
  char *body = json_dumps(t, JSON_COMPACT);
  json_decref(t);
  json_decref(b);
  struct as_resp r;
  as_post(s, "/tokenize", body, &r);
  free(body);
  if (r.status != 200) fprintf(stderr, "tokenize %d: %s\n", r.status, r.body ? r.body : "");
  TH_REQUIRE(r.status == 200);
  json_t *j = as_json(&r);
  json_t *ids = json_object_get(j, "tokens");
  *n = (int)json_array_size(ids);
  int32_t *v = malloc(sizeof(int32_t) * (size_t)(*n + N_GEN + 1));
  TH_REQUIRE(v != NULL);
  for (int i = 0; i < *n; i++)
    v[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
  json_decref(j);
  as_resp_free(&r);
  return v;
}

static void refused(const struct as_server *s, const char *body, const char *param) {
  struct as_resp r;
  as_post(s, "/v1/chat/completions", body, &r);
  as_check_error(&r, 400, param);
  as_resp_free(&r);
}

/* ---- the offline path ------------------------------------------------------------ */

struct image {
  const uint8_t *rgb;
  int w, h;
};

/* Greedy tokens of ids[0..n) with the images (in prompt order, at the runs
 * of image_id) written over their soft tokens, on the CPU backend: the
 * whole prompt in one forward, then one token per forward. out[N_GEN]. */
static void offline_greedy(const char *dir, const int32_t *ids, int n, const struct image *ims,
                           int n_ims, int budget, int32_t *out) {
  char err[512] = "";
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create(2, &be) == 0 && be);
  struct wk_model *m = NULL;
  struct wk_model_opts mo = {.max_batch_tokens = n + 8, .max_seqs = 1, .quiet = 1};
  if (wk_model_load(dir, be, &mo, &m, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "text model: %s", err);
    th_stop();
  }
  struct wk_vision_g4 *v = NULL;
  if (wk_vision_g4_load(dir, be, NULL, &v, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "vision tower: %s", err);
    th_stop();
  }
  const struct md_vision_g4_cfg *vc = wk_vision_g4_config(v);
  const struct md_config *c = wk_model_config(m);
  int H = c->hidden, V = c->vocab;
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
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  struct wk_page_alloc pa;
  TH_REQUIRE(wk_page_alloc_init(&pa, wk_model_n_pages(m)) == 0);
  struct wk_seq_blocks blk = {0};
  TH_REQUIRE(wk_seq_blocks_reserve(&blk, kv, &pa, n + N_GEN) == 0);
  float *logits = malloc(sizeof(float) * (size_t)V);
  int32_t *seq = malloc(sizeof(int32_t) * (size_t)(n + N_GEN));
  TH_REQUIRE(logits && seq);
  memcpy(seq, ids, sizeof(int32_t) * (size_t)n);
  for (int k = 0, p0 = 0, len = n; k < N_GEN; k++) {
    struct wk_seq_input s = {.tokens = seq + p0, .n_tokens = len - p0, .pos0 = p0, .n_out = 1};
    if (k == 0) {
      s.embeds = emb, s.n_embeds = n_ims;
      s.bidir = &ranges[0][0], s.n_bidir = n_ims;
    }
    for (int g = 0; g < kv->n_groups; g++) {
      s.block_tables[g] = blk.table[g];
      s.n_blocks[g] = blk.n[g];
    }
    struct wk_batch b = {.seqs = &s, .n_seqs = 1, .logits = logits};
    if (wk_model_forward(m, &b, err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "forward: %s", err);
      th_stop();
    }
    int best = 0;
    for (int t = 1; t < V; t++)
      if (logits[t] > logits[best]) best = t;
    out[k] = best;
    seq[len] = best;
    p0 = len;
    len++;
  }
  wk_seq_blocks_release(&blk, kv, &pa);
  wk_page_alloc_free(&pa);
  free(logits);
  free(seq);
  for (int i = 0; i < n_ims; i++)
    free(rows[i]);
  wk_vision_g4_free(v);
  wk_model_free(m);
  kn_backend_destroy(be);
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
    int nt = 0, ni = 0;
    int32_t *t_ids = tokenize(&a, text_only, &nt);
    int32_t *i_ids = tokenize(&a, two, &ni);
    TH_CHECK_EQ_INT(ni, nt + p0.soft_tokens + 2 + p1.soft_tokens + 2);
    /* the runs, in place */
    int k = 0, runs = 0;
    while (k < ni && i_ids[k] != vc->boi_id)
      k++;
    for (int img = 0; img < 2 && k < ni; img++) {
      int want = img == 0 ? p0.soft_tokens : p1.soft_tokens, soft = 0;
      TH_CHECK_EQ_INT(i_ids[k], vc->boi_id);
      k++;
      while (k < ni && i_ids[k] == vc->image_id)
        k++, soft++;
      TH_CHECK_EQ_INT(soft, want);
      TH_CHECK_EQ_INT(i_ids[k], vc->eoi_id);
      k++;
      runs++;
    }
    TH_CHECK_EQ_INT(runs, 2);
    struct answer r;
    chat(&a, two, &r);
    TH_CHECK_EQ_INT(r.prompt_tokens, ni);
    fprintf(stderr, "budget %d: %d + %d soft tokens, %d prompt tokens: '%s'\n", budget,
            p0.soft_tokens, p1.soft_tokens, ni, r.text);
    free(t_ids);
    free(i_ids);
    free(text_only);
    free(two);
  }

  /* (b) deterministic, the same chunked (B), streamed, and the offline path's */
  char *one = chat_body(TEXT, (const char *[]){u0}, 1, "What is in it?", 70, 0);
  char *two = chat_body(TEXT, (const char *[]){u0, u1}, 2, "Which is brighter?", 70, 0);
  char *two_s = chat_body(TEXT, (const char *[]){u0, u1}, 2, "Which is brighter?", 70, 1);
  struct answer a1, a1b, b1, a2, b2;
  chat(&a, one, &a1);
  chat(&a, one, &a1b);
  chat(&b, one, &b1);
  chat(&a, two, &a2);
  chat(&b, two, &b2);
  TH_CHECK_EQ_STR(a1.text, a1b.text);
  TH_CHECK_EQ_STR(a1.text, b1.text);
  TH_CHECK_EQ_STR(a2.text, b2.text);
  TH_CHECK_EQ_INT(a2.prompt_tokens, b2.prompt_tokens);
  TH_CHECK(a2.prompt_tokens > 100); /* B ran it in chunks */
  { /* the image is read: another picture behind the same words answers otherwise */
    char *other = chat_body(TEXT, (const char *[]){u1}, 1, "What is in it?", 70, 0);
    struct answer o;
    chat(&a, other, &o);
    TH_CHECK(strcmp(o.text, a1.text) != 0);
    free(other);
  }
  {
    struct as_resp r;
    as_post(&b, "/v1/chat/completions", two_s, &r);
    TH_REQUIRE(r.status == 200);
    char st[1024];
    TH_CHECK(as_sse_text(r.body, 0, st, sizeof(st), NULL) > 0);
    TH_CHECK_EQ_STR(st, a2.text);
    as_resp_free(&r);
  }
  {
    struct tk_tokenizer *tok = NULL;
    char path[400];
    snprintf(path, sizeof(path), "%s/tokenizer.json", a.model);
    TH_REQUIRE(tk_load(path, &tok, err, sizeof(err)) == 0);
    const char *bodies[2] = {one, two};
    const struct answer *want[2] = {&a1, &a2};
    struct image ims[2] = {im0, im1};
    for (int q = 0; q < 2; q++) {
      int n = 0;
      int32_t *ids = tokenize(&a, bodies[q], &n);
      int32_t gen[N_GEN];
      offline_greedy(a.model, ids, n, ims, q + 1, 70, gen);
      for (int k = 0; k < N_GEN; k++) {
        char *s = NULL;
        size_t len = 0, cap = 0;
        TH_REQUIRE(tk_decode(tok, &gen[k], 1, 0, &s, &len, &cap) == 0);
        if ((int)len != want[q]->tok_len[k] || memcmp(s, want[q]->tok[k], len) != 0)
          th_fail(__FILE__, __LINE__, "prompt %d, token %d: offline %d '%.*s', served '%.*s'", q, k,
                  gen[k], (int)len, s, want[q]->tok_len[k], want[q]->tok[k]);
        free(s);
      }
      free(ids);
    }
    tk_free(tok);
  }

  /* (c) bad input: 400s naming the field or the part; both servers go on */
  {
    char *bad = chat_body(TEXT, (const char *[]){u0}, 1, NULL, 100, 0);
    refused(&a, bad, "mm_processor_kwargs.max_soft_tokens");
    free(bad);
    bad = chat_body(TEXT, (const char *[]){u0}, 1, NULL, -1, 0);
    refused(&a, bad, "mm_processor_kwargs.max_soft_tokens");
    free(bad);
    char *trunc = data_url(png0, n0 * 3 / 5);
    bad = chat_body("Look:", (const char *[]){trunc}, 1, NULL, 0, 0);
    refused(&b, bad, PART(1));
    free(bad);
    bad = chat_body("Look:", (const char *[]){"data:image/png;base64,AAAA"}, 1, NULL, 70, 0);
    refused(&a, bad, PART(1));
    free(bad);
    free(trunc);
    /* the default budget (280 soft tokens) does not fit B's 100-token steps */
    bad = chat_body(TEXT, (const char *[]){u1}, 1, NULL, 0, 0);
    struct as_resp r;
    as_post(&b, "/v1/chat/completions", bad, &r);
    TH_CHECK(r.status == 400);
    as_resp_free(&r);
    free(bad);
    struct answer again;
    chat(&a, two, &again);
    TH_CHECK_EQ_STR(again.text, a2.text);
    chat(&b, two, &again);
    TH_CHECK_EQ_STR(again.text, a2.text);
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
