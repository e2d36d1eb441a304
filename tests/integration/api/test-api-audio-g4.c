/* test-api-audio-g4.c — Gemma 4 audio input through the OpenAI API on the
 * tiny Gemma 4 with an audio and a vision tower (make-tiny-model --arch
 * gemma4 --audio --vision --chat-format gemma4), two servers side by side:
 *   A: the default step budget (prompts in one chunk), limits in vLLM's JSON
 *      form {"image": 2, "audio": 2};
 *   B: --max-num-batched-tokens 96 (prompts in chunks whose ends the
 *      scheduler moves out of the clips: a 40-token clip or a 70-token image
 *      and its markers fit one step, the text around them does not), limits
 *      as image=2,audio=2.
 * The clips are 32-bit float WAVs at 16 kHz, which the server reads back
 * exactly, so the test can compute what the server should from the samples.
 * Checked:
 *   (a) the prompt is the text's tokens plus, per clip, <|audio> + N x
 *       <|audio|> + <audio|> (ids from config.json, N the clip's soft tokens
 *       from the checkpoint's extractor: md_audio_features' mask):
 *       usage.prompt_tokens and /tokenize;
 *   (b) greedy output at temperature 0 is the same twice, on A and on B
 *       (chunked), streamed or not, with one clip, two clips, and a clip with
 *       an image in one prompt; requests with audio running at once with
 *       text-only ones answer as they do alone; the same clip twice is a
 *       prefix-cache hit through the clip (lmserve:prefix_cache_hits) with
 *       the same answer; and the answers are the offline path's: this
 *       process computes the clips' features (md_audio_features), encodes
 *       them (wk_audio_g4_encode, which test worker-audio-g4 holds to the
 *       float64 numpy reference of transformers' audio tower), writes the
 *       rows over the soft tokens and decodes greedily with wk_model_forward
 *       (which the golden tests hold to transformers); the tokens (as the
 *       logprobs' bytes) agree;
 *   (c) bad clips are 400s naming their part: truncated, WAV data declared as
 *       mp3, over 30 s, not audio, too short for one token, one clip past
 *       the limit; both servers serve on;
 *   (d) the official openai client (api-openai-audio.mjs) sends a clip and
 *       gets the same text, and a BadRequestError naming a broken clip. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-audio-g4.h"
#include "model/md-config.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/api/api-images.h"
#include "tests/integration/api/api-serve.h"
#include "tokenizer/tk-tokenizer.h"
#include "worker/wk-audio-g4.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"

#define N_GEN   8
#define RATE    16000
#define PART(k) "messages[0].content[" #k "].input_audio"

/* ---- clips -------------------------------------------------------------------- */

struct clip {
  float *x; /* samples at RATE */
  size_t n;
  char *b64; /* its float WAV in base64 */
};

/* kind 0: a chord with a slow tremolo; 1: a rising chirp with a little noise */
static struct clip make_clip(int kind, double seconds) {
  struct clip c = {0};
  c.n = (size_t)(seconds * RATE);
  c.x = malloc(sizeof(float) * c.n);
  TH_REQUIRE(c.x != NULL);
  uint32_t st = 12345u + (uint32_t)kind;
  for (size_t i = 0; i < c.n; i++) {
    double t = (double)i / RATE, v;
    st = st * 1664525u + 1013904223u;
    if (kind == 0)
      v = (0.3 * sin(2 * M_PI * 220 * t) + 0.2 * sin(2 * M_PI * 330 * t)) *
          (0.6 + 0.4 * sin(2 * M_PI * 3 * t));
    else
      v = 0.4 * sin(2 * M_PI * (200 + 900 * t) * t) + 0.05 * ((double)(st >> 8) / (1 << 24) - 0.5);
    c.x[i] = (float)v;
  }
  size_t len = 0;
  uint8_t *wav = api_wav_f32(c.x, c.n, RATE, &len);
  c.b64 = api_base64(wav, len);
  free(wav);
  return c;
}

static void free_clip(struct clip *c) {
  free(c->x);
  free(c->b64);
}

/* ---- requests ------------------------------------------------------------------- */

/* A user message: text, a clip per b64 (formats "wav" unless fmt says), an
 * image when url (at most 70 soft tokens), more text. */
static char *chat_body(const char *before, const char *const b64[], int n, const char *fmt,
                       const char *url, const char *after, int stream) {
  json_t *parts = json_array();
  json_array_append_new(parts, json_pack("{s:s, s:s}", "type", "text", "text", before));
  for (int i = 0; i < n; i++)
    json_array_append_new(parts,
                          json_pack("{s:s, s:{s:s, s:s}}", "type", "input_audio", "input_audio",
                                    "data", b64[i], "format", fmt ? fmt : "wav"));
  if (url)
    json_array_append_new(
        parts, json_pack("{s:s, s:{s:s}}", "type", "image_url", "image_url", "url", url));
  if (after) json_array_append_new(parts, json_pack("{s:s, s:s}", "type", "text", "text", after));
  json_t *b =
      json_pack("{s:[{s:s, s:o}], s:i, s:f, s:b, s:b}", "messages", "role", "user", "content",
                parts, "max_tokens", N_GEN, "temperature", 0.0, "ignore_eos", 1, "logprobs", 1);
  if (url) /* an image of at most 70 tokens fits B's steps */
    json_object_set_new(b, "mm_processor_kwargs", json_pack("{s:i}", "max_soft_tokens", 70));
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

static void parse_answer(const struct as_resp *r, struct answer *a) {
  memset(a, 0, sizeof(*a));
  if (r->status != 200) fprintf(stderr, "answer %d: %s\n", r->status, r->body ? r->body : "");
  TH_REQUIRE(r->status == 200);
  json_t *j = as_json(r);
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
}

static void chat(const struct as_server *s, const char *body, struct answer *a) {
  struct as_resp r;
  as_post(s, "/v1/chat/completions", body, &r);
  parse_answer(&r, a);
  as_resp_free(&r);
}

/* /tokenize of a chat body's messages: the ids (malloc'd, room for N_GEN
 * more), *n of them. */
static int32_t *tokenize(const struct as_server *s, const char *body_json, int *n) {
  json_t *b = json_loads(body_json, 0, NULL);
  TH_REQUIRE(b != NULL);
  json_t *t = json_pack("{s:O}", "messages", json_object_get(b, "messages"));
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
  if (r.status != 400)
    fprintf(stderr, "expected a 400 for %s: %d %.300s\n", param, r.status, r.body ? r.body : "");
  as_check_error(&r, 400, param);
  as_resp_free(&r);
}

/* ---- what the checkpoint's extractor makes of a clip ------------------------------ */

struct feats {
  float *feat; /* [frames][n_mel] */
  uint8_t *mask;
  int frames, tokens;
};

static struct feats features(const struct md_audio_fe_cfg *fe, const struct clip *c) {
  struct feats f = {0};
  f.frames = (int)md_audio_fe_frames(fe, c->n);
  f.feat = malloc(sizeof(float) * (size_t)f.frames * (size_t)fe->n_mel);
  f.mask = malloc((size_t)f.frames);
  TH_REQUIRE(f.feat && f.mask && md_audio_features(fe, c->x, c->n, f.feat, f.mask) == 0);
  f.tokens = md_audio_soft_tokens(f.mask, (size_t)f.frames);
  return f;
}

static void free_feats(struct feats *f) {
  free(f->feat);
  free(f->mask);
}

/* ---- the offline path ------------------------------------------------------------ */

/* Greedy tokens of ids[0..n) with the clips' rows (in prompt order, at the
 * runs of audio_id) written over their soft tokens, on the CPU backend: the
 * whole prompt in one forward, then one token per forward. out[N_GEN]. */
static void offline_greedy(const char *dir, const int32_t *ids, int n, const struct feats *fs,
                           int n_clips, int audio_id, int32_t *out) {
  char err[512] = "";
  struct kn_backend *be = NULL;
  TH_REQUIRE(kn_cpu_backend_create(2, &be) == 0 && be);
  struct wk_model *m = NULL;
  struct wk_model_opts mo = {.max_batch_tokens = n + 8, .max_seqs = 1, .quiet = 1};
  if (wk_model_load(dir, be, &mo, &m, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "text model: %s", err);
    th_stop();
  }
  struct wk_audio_g4 *a = NULL;
  if (wk_audio_g4_load(dir, be, NULL, &a, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "audio tower: %s", err);
    th_stop();
  }
  const struct md_config *c = wk_model_config(m);
  int H = c->hidden, V = c->vocab;
  TH_REQUIRE(wk_audio_g4_text_hidden(a) == H && n_clips <= 4);
  struct wk_seq_embed emb[4];
  float *rows[4] = {0};
  for (int i = 0, at = 0; i < n_clips; i++) {
    struct wk_g4_audio clip = {fs[i].feat, fs[i].mask, fs[i].frames, fs[i].tokens};
    rows[i] = malloc(sizeof(float) * (size_t)fs[i].tokens * (size_t)H);
    TH_REQUIRE(rows[i] != NULL);
    if (wk_audio_g4_encode(a, &clip, 1, rows[i], err, sizeof(err))) {
      th_fail(__FILE__, __LINE__, "encode: %s", err);
      th_stop();
    }
    while (at < n && ids[at] != audio_id)
      at++;
    TH_REQUIRE(at + fs[i].tokens <= n);
    emb[i] = (struct wk_seq_embed){.pos = at, .n = fs[i].tokens, .rows = rows[i]};
    at += fs[i].tokens;
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
    /* a clip's tokens attend causally: no bidirectional ranges */
    struct wk_seq_input s = {.tokens = seq + p0, .n_tokens = len - p0, .pos0 = p0, .n_out = 1};
    if (k == 0) s.embeds = emb, s.n_embeds = n_clips;
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
  for (int i = 0; i < n_clips; i++)
    free(rows[i]);
  wk_audio_g4_free(a);
  wk_model_free(m);
  kn_backend_destroy(be);
}

/* The served answer's tokens are the offline path's. */
static void check_offline(const struct as_server *s, const char *body, const struct feats *fs,
                          int n_clips, int audio_id, const struct answer *want) {
  char err[512], path[400];
  struct tk_tokenizer *tok = NULL;
  snprintf(path, sizeof(path), "%s/tokenizer.json", s->model);
  TH_REQUIRE(tk_load(path, &tok, err, sizeof(err)) == 0);
  int n = 0;
  int32_t *ids = tokenize(s, body, &n);
  int32_t gen[N_GEN];
  offline_greedy(s->model, ids, n, fs, n_clips, audio_id, gen);
  for (int k = 0; k < N_GEN; k++) {
    char *t = NULL;
    size_t len = 0, cap = 0;
    TH_REQUIRE(tk_decode(tok, &gen[k], 1, 0, &t, &len, &cap) == 0);
    if ((int)len != want->tok_len[k] || memcmp(t, want->tok[k], len) != 0)
      th_fail(__FILE__, __LINE__, "%d clips, token %d: offline %d '%.*s', served '%.*s'", n_clips,
              k, gen[k], (int)len, t, want->tok_len[k], want->tok[k]);
    free(t);
  }
  free(ids);
  tk_free(tok);
}

/* ---- the test ------------------------------------------------------------------ */

#define TEXT                                                                                       \
  "Here is a recording, and a few questions about it, which you should answer carefully and "      \
  "in order, saying what you hear, who might be speaking or playing, where it could have been "    \
  "recorded and what happens over its length, from the first sound to the last one. Take your "    \
  "time: a careful answer that names the instruments, the voices, the room and the mood of the "   \
  "piece is worth more than a quick one, and a guess is fine where you are not sure. Listen:"

TH_TEST(gemma4_audio_through_the_api) {
  th_proc_init(1200);
  struct as_server a = {.audio = 1}, b = {.audio = 1};
  as_start(&a, 0, (char *[]){"--limit-mm-per-prompt", "{\"image\": 2, \"audio\": 2}", NULL});
  as_start(&b, 0,
           (char *[]){"--max-num-batched-tokens", "96", "--limit-mm-per-prompt", "image=2,audio=2",
                      NULL});

  /* the audio ids and the extractor, from the checkpoint */
  struct md_config *cfg = calloc(1, sizeof(*cfg));
  char err[512];
  TH_REQUIRE(cfg && md_config_load(a.model, cfg, err, sizeof(err)) == 0);
  const struct md_audio_g4_cfg *ac = &cfg->audio_g4;
  TH_REQUIRE(ac->present);
  struct md_audio_fe_cfg fe;
  TH_REQUIRE(md_audio_fe_load(a.model, &fe, err, sizeof(err)) == 0);
  TH_REQUIRE(fe.sampling_rate == RATE);

  struct clip c0 = make_clip(0, 1.0), c1 = make_clip(1, 1.6);
  struct feats f[2] = {features(&fe, &c0), features(&fe, &c1)};
  TH_CHECK_EQ_INT(f[0].tokens, 25); /* 25 a second */
  TH_CHECK_EQ_INT(f[1].tokens, 40);

  /* (a) the prompt: text + per clip <|audio> N x <|audio|> <audio|> */
  char *text_only = chat_body(TEXT, NULL, 0, NULL, NULL, NULL, 0);
  char *two = chat_body(TEXT, (const char *[]){c0.b64, c1.b64}, 2, NULL, NULL, NULL, 0);
  {
    int nt = 0, ni = 0;
    int32_t *t_ids = tokenize(&a, text_only, &nt);
    int32_t *i_ids = tokenize(&a, two, &ni);
    TH_CHECK_EQ_INT(ni, nt + f[0].tokens + 2 + f[1].tokens + 2);
    int k = 0, runs = 0;
    while (k < ni && i_ids[k] != ac->boa_id)
      k++;
    for (int c = 0; c < 2 && k < ni; c++) {
      int soft = 0;
      TH_CHECK_EQ_INT(i_ids[k], ac->boa_id);
      k++;
      while (k < ni && i_ids[k] == ac->audio_id)
        k++, soft++;
      TH_CHECK_EQ_INT(soft, f[c].tokens);
      TH_CHECK_EQ_INT(i_ids[k], ac->eoa_id);
      k++;
      runs++;
    }
    TH_CHECK_EQ_INT(runs, 2);
    struct answer r;
    chat(&a, two, &r);
    TH_CHECK_EQ_INT(r.prompt_tokens, ni);
    free(t_ids);
    free(i_ids);
  }

  /* (b) deterministic, the same chunked (B), streamed, mixed, cached, offline */
  char *one = chat_body(TEXT, (const char *[]){c0.b64}, 1, NULL, NULL, "What is heard?", 0);
  char *two_q =
      chat_body(TEXT, (const char *[]){c0.b64, c1.b64}, 2, NULL, NULL, "Which is louder?", 0);
  char *two_s =
      chat_body(TEXT, (const char *[]){c0.b64, c1.b64}, 2, NULL, NULL, "Which is louder?", 1);
  uint8_t *png = NULL;
  size_t n_png = 0;
  uint8_t *rgb = api_picture_rgb(1, 40, 30);
  png = api_png_encode(rgb, 40, 30, &n_png);
  char *url = api_data_url(png, n_png);
  char *with_image =
      chat_body(TEXT, (const char *[]){c1.b64}, 1, NULL, url, "What goes with the picture?", 0);
  struct answer a1, a1b, b1, a2, b2, ai, bi;
  chat(&a, one, &a1);
  chat(&a, one, &a1b);
  chat(&b, one, &b1);
  chat(&a, two_q, &a2);
  chat(&b, two_q, &b2);
  chat(&a, with_image, &ai);
  chat(&b, with_image, &bi);
  TH_CHECK_EQ_STR(a1.text, a1b.text);
  TH_CHECK_EQ_STR(a1.text, b1.text);
  TH_CHECK_EQ_STR(a2.text, b2.text);
  TH_CHECK_EQ_STR(ai.text, bi.text);
  /* B ran them in chunks */
  TH_CHECK(a1.prompt_tokens > 96 && a2.prompt_tokens > 96 && ai.prompt_tokens > 96);
  fprintf(stderr, "one clip (%d prompt tokens): '%s'\ntwo clips (%d): '%s'\nclip and image: '%s'\n",
          a1.prompt_tokens, a1.text, a2.prompt_tokens, a2.text, ai.text);
  { /* the clip is heard: another clip behind the same words answers otherwise */
    char *other = chat_body(TEXT, (const char *[]){c1.b64}, 1, NULL, NULL, "What is heard?", 0);
    struct answer o;
    chat(&a, other, &o);
    TH_CHECK(strcmp(o.text, a1.text) != 0);
    free(other);
  }
  { /* streamed on B: the same text */
    struct as_resp r;
    as_post(&b, "/v1/chat/completions", two_s, &r);
    TH_REQUIRE(r.status == 200);
    char st[1024];
    TH_CHECK(as_sse_text(r.body, 0, st, sizeof(st), NULL) > 0);
    TH_CHECK_EQ_STR(st, a2.text);
    as_resp_free(&r);
  }
  { /* with text-only requests in the same steps: the same answers */
    char *text_q = chat_body(TEXT, NULL, 0, NULL, NULL, "What is heard?", 0);
    struct answer t_alone;
    chat(&b, text_q, &t_alone);
    const char *paths[4] = {"/v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions",
                            "/v1/chat/completions"};
    const char *bodies[4] = {text_q, one, text_q, two_q};
    struct as_resp rs[4];
    TH_REQUIRE(as_post_many(&b, 4, paths, bodies, rs) == 4);
    struct answer got[4];
    for (int i = 0; i < 4; i++) {
      parse_answer(&rs[i], &got[i]);
      as_resp_free(&rs[i]);
    }
    TH_CHECK_EQ_STR(got[0].text, t_alone.text);
    TH_CHECK_EQ_STR(got[1].text, a1.text);
    TH_CHECK_EQ_STR(got[2].text, t_alone.text);
    TH_CHECK_EQ_STR(got[3].text, a2.text);
    free(text_q);
  }
  { /* the same clips again: the blocks through the first clip come from the prefix
     * cache (the hit reaches past its <audio|>), the answer is the same */
    int n = 0, first_eoa = 0;
    int32_t *ids = tokenize(&a, two_q, &n);
    while (first_eoa < n && ids[first_eoa] != ac->eoa_id)
      first_eoa++;
    free(ids);
    double h0 = as_metric(&a, "lmserve:prefix_cache_hits_total");
    struct answer again;
    chat(&a, two_q, &again);
    double h1 = as_metric(&a, "lmserve:prefix_cache_hits_total");
    TH_CHECK_EQ_STR(again.text, a2.text);
    TH_CHECK(h1 - h0 > (double)first_eoa);
    fprintf(stderr, "prefix hit: %.0f of %d prompt tokens (the first clip ends at %d)\n", h1 - h0,
            again.prompt_tokens, first_eoa);
  }
  check_offline(&a, one, f, 1, ac->audio_id, &a1);
  check_offline(&a, two_q, f, 2, ac->audio_id, &a2);

  /* (c) bad clips: 400s naming the part; both servers go on */
  {
    size_t len = 0;
    uint8_t *wav = api_wav_f32(c0.x, c0.n, RATE, &len);
    char *t = api_base64(wav, len * 3 / 5); /* the data chunk cut short */
    char *bad = chat_body("Hear:", (const char *[]){t}, 1, NULL, NULL, NULL, 0);
    refused(&a, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){c0.b64}, 1, "mp3", NULL, NULL, 0);
    refused(&b, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){c0.b64}, 1, "flac", NULL, NULL, 0);
    refused(&a, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){"bm90IGF1ZGlvIGF0IGFsbCwganVzdCB0ZXh0"}, 1, NULL,
                    NULL, NULL, 0);
    refused(&a, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){"%%%"}, 1, NULL, NULL, NULL, 0);
    refused(&b, bad, PART(1));
    free(bad);
    struct clip tiny = make_clip(0, 100.0 / RATE), big = make_clip(1, 30.5);
    bad = chat_body("Hear:", (const char *[]){tiny.b64}, 1, NULL, NULL, NULL, 0);
    refused(&a, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){big.b64}, 1, NULL, NULL, NULL, 0);
    refused(&b, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){c0.b64, c1.b64, c0.b64}, 3, NULL, NULL, NULL, 0);
    refused(&a, bad, PART(3));
    refused(&b, bad, PART(3));
    free(bad);
    free_clip(&tiny);
    free_clip(&big);
    free(t);
    free(wav);
    struct answer again;
    chat(&a, two_q, &again);
    TH_CHECK_EQ_STR(again.text, a2.text);
    chat(&b, two_q, &again);
    TH_CHECK_EQ_STR(again.text, a2.text);
  }

  /* (d) the official client (node + node_modules/openai), when present */
  if (th_node_major() < 20 || !th_npm_has("openai")) {
    fprintf(stderr, "SKIP (loudly): node >= 20 or node_modules/openai missing: the openai "
                    "client's audio request did not run\n");
  } else {
    char script[1024], e_url[96], e_text[1100];
    snprintf(script, sizeof(script), "%s/integration/api/api-openai-audio.mjs", th_tests_dir());
    snprintf(e_url, sizeof(e_url), "LMSERVE_URL=http://127.0.0.1:%d/v1", b.port);
    snprintf(e_text, sizeof(e_text), "LMSERVE_EXPECT=%s", a1.text);
    char *clip_env = malloc(strlen(c0.b64) + 32);
    TH_REQUIRE(clip_env != NULL);
    sprintf(clip_env, "LMSERVE_AUDIO=%s", c0.b64);
    char *env[] = {
        e_url, "LMSERVE_MODEL=default", clip_env, e_text, "LMSERVE_TEXT=" TEXT, "NO_COLOR=1", NULL};
    th_node_test(script, env, 300000);
    free(clip_env);
  }

  free(text_only);
  free(two);
  free(one);
  free(two_q);
  free(two_s);
  free(with_image);
  free(url);
  free(png);
  free(rgb);
  free_feats(&f[0]);
  free_feats(&f[1]);
  free_clip(&c0);
  free_clip(&c1);
  free(cfg);
  as_stop(&a);
  as_stop(&b);
}
