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
 *       the limit; both servers serve on; with audio=0 a clip is a 400
 *       saying audio is turned off, and images are still taken;
 *   (d) the official openai client (api-openai-audio.mjs) sends a clip and
 *       gets the same text, and a BadRequestError naming a broken clip; its
 *       audio.transcriptions.create gets (f)'s text, as JSON and as text;
 *   (f) POST /v1/audio/transcriptions and /translations (multipart forms as
 *       curl and the OpenAI clients send them) answer, as JSON with token
 *       usage or as text, what the chat request of their instruction and the
 *       clip answers; their refusals name the field;
 *   (e) a third server, C, on a checkpoint whose audio tower an mmproj file
 *       can hold (--audio-shape tiny-default), served from the GGUF files
 *       export-gguf writes (the model file and llama.cpp's mmproj file with
 *       both towers): its answers are the offline path's on the safetensors
 *       checkpoint. */
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
#include "tests/integration/api/api-greedy.h"
#include "tests/integration/api/api-images.h"
#include "tests/integration/api/api-serve.h"
#include "tokenizer/tk-tokenizer.h"
#include "worker/wk-audio-g4.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"

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
  /* an image of at most 70 tokens fits B's steps */
  return api_greedy_body(parts, url ? json_pack("{s:i}", "max_soft_tokens", 70) : NULL, stream);
}

/* ---- the audio endpoints ----------------------------------------------------------- */

/* A multipart form as curl -F writes it: the fields (name, value pairs, NULL
 * ended), then the clip's WAV bytes as the part "file" (malloc'd; *len bytes). */
static char *audio_form(const char *const *fields, const uint8_t *wav, size_t wav_len,
                        size_t *len) {
  size_t cap = wav_len + 4096, k = 0;
  char *f = malloc(cap);
  TH_REQUIRE(f != NULL);
  for (size_t i = 0; fields[i]; i += 2)
    k += (size_t)snprintf(f + k, cap - k,
                          "--zZ9\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\n%s\r\n",
                          fields[i], fields[i + 1]);
  k += (size_t)snprintf(f + k, cap - k,
                        "--zZ9\r\nContent-Disposition: form-data; name=\"file\"; "
                        "filename=\"clip.wav\"\r\nContent-Type: audio/wav\r\n\r\n");
  if (wav_len) memcpy(f + k, wav, wav_len);
  k += wav_len;
  k += (size_t)snprintf(f + k, cap - k, "\r\n--zZ9--\r\n");
  *len = k;
  return f;
}

/* The chat request an audio endpoint stands for: the instruction, then the clip,
 * API_GEN tokens at temperature 0 (EOS may end it, as on the endpoint). */
static void chat_twin(const struct as_server *s, const char *instr, const char *b64,
                      struct as_resp *r) {
  json_t *b = json_pack("{s:[{s:s, s:[{s:s, s:s}, {s:s, s:{s:s, s:s}}]}], s:i, s:f}", "messages",
                        "role", "user", "content", "type", "text", "text", instr, "type",
                        "input_audio", "input_audio", "data", b64, "format", "wav", "max_tokens",
                        API_GEN, "temperature", 0.0);
  char *body = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  TH_REQUIRE(body != NULL);
  as_post(s, "/v1/chat/completions", body, r);
  free(body);
}

/* POST /v1/audio/transcriptions and /translations: each answer is the text of
 * the chat request with its instruction and the clip, in both forms; the
 * refusals name their field. The plain transcription's text goes to
 * transcript[cap]. */
static void check_audio_endpoints(const struct as_server *s, const struct clip *c, char *transcript,
                                  size_t cap) {
  size_t wav_len = 0, n;
  uint8_t *wav = api_wav_f32(c->x, c->n, RATE, &wav_len);
  const char *ct = "multipart/form-data; boundary=zZ9";
  char gen[16];
  snprintf(gen, sizeof(gen), "%d", API_GEN);
  static const struct {
    const char *path, *lang, *instr;
  } cases[] = {
      {"/v1/audio/transcriptions", NULL, "Transcribe this audio:"},
      {"/v1/audio/transcriptions", "de", "Transcribe this audio into German:"},
      {"/v1/audio/translations", NULL, "Translate this audio into English:"},
      {"/v1/audio/translations", "ja", "Translate this audio from Japanese into English:"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct as_resp tw;
    chat_twin(s, cases[i].instr, c->b64, &tw);
    json_t *tj = as_json(&tw);
    const char *want = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(tj, "choices"), 0), "message"), "content"));
    json_t *tu = json_object_get(tj, "usage");
    TH_REQUIRE(tw.status == 200 && want != NULL);
    /* as JSON, as text, streamed */
    for (int form_kind = 0; form_kind < 3; form_kind++) {
      const char *fields[12] = {"temperature", "0", "max_completion_tokens", gen};
      int k = 4;
      if (cases[i].lang) fields[k++] = "language", fields[k++] = cases[i].lang;
      if (form_kind == 1) fields[k++] = "response_format", fields[k++] = "text";
      if (form_kind == 2) fields[k++] = "stream", fields[k++] = "true";
      fields[k] = NULL;
      char *form = audio_form(fields, wav, wav_len, &n);
      struct as_resp r;
      as_post_bytes(s, cases[i].path, ct, form, n, &r);
      free(form);
      TH_CHECK_EQ_INT(r.status, 200);
      if (form_kind < 2) {
        const int text = form_kind == 1;
        char got_ct[128] = "";
        as_header(&r, "Content-Type", got_ct, sizeof(got_ct));
        if (text) {
          TH_CHECK(!strncmp(got_ct, "text/plain", 10));
          TH_CHECK_EQ_STR(r.body, want);
        } else {
          TH_CHECK(!strncmp(got_ct, "application/json", 16));
          json_t *j = as_json(&r);
          json_t *u = json_object_get(j, "usage");
          TH_CHECK_EQ_STR(json_string_value(json_object_get(j, "text")), want);
          TH_CHECK_EQ_STR(json_string_value(json_object_get(u, "type")), "tokens");
          TH_CHECK_EQ_INT(json_integer_value(json_object_get(u, "input_tokens")),
                          json_integer_value(json_object_get(tu, "prompt_tokens")));
          TH_CHECK_EQ_INT(json_integer_value(json_object_get(u, "output_tokens")),
                          json_integer_value(json_object_get(tu, "completion_tokens")));
          TH_CHECK_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")),
                          json_integer_value(json_object_get(tu, "total_tokens")));
          json_decref(j);
        }
      } else { /* OpenAI's delta events add up to the text, then the done event */
        char sum[1024] = "", done[1024] = "";
        int deltas = 0, dones = 0, ended = 0;
        for (char *l = r.body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
          if (strncmp(l, "data: ", 6)) continue;
          TH_CHECK(!ended); /* nothing after [DONE] */
          if (!strncmp(l + 6, "[DONE]", 6)) {
            ended = 1;
            continue;
          }
          char *e = strchr(l, '\n');
          json_t *j = json_loadb(l + 6, e ? (size_t)(e - l - 6) : strlen(l + 6), 0, NULL);
          const char *type = json_string_value(json_object_get(j, "type"));
          TH_REQUIRE(type != NULL);
          if (!strcmp(type, "transcript.text.delta")) {
            TH_CHECK(dones == 0);
            strncat(sum, json_string_value(json_object_get(j, "delta")),
                    sizeof(sum) - strlen(sum) - 1);
            deltas++;
          } else {
            TH_CHECK_EQ_STR(type, "transcript.text.done");
            snprintf(done, sizeof(done), "%s", json_string_value(json_object_get(j, "text")));
            TH_CHECK_EQ_INT(
                json_integer_value(json_object_get(json_object_get(j, "usage"), "input_tokens")),
                json_integer_value(json_object_get(tu, "prompt_tokens")));
            dones++;
          }
          json_decref(j);
        }
        TH_CHECK(ended && dones == 1 && deltas >= 1);
        TH_CHECK_EQ_STR(sum, want);
        TH_CHECK_EQ_STR(done, want);
      }
      as_resp_free(&r);
    }
    if (i == 0) snprintf(transcript, cap, "%s", want);
    fprintf(stderr, "%s%s%s: '%s'\n", cases[i].path, cases[i].lang ? " language=" : "",
            cases[i].lang ? cases[i].lang : "", want);
    json_decref(tj);
    as_resp_free(&tw);
  }
  /* refusals: each names its field, and the server goes on */
  static const char *const bad[][3] = {
      {"response_format", "srt", "response_format"},
      {"language", "xx", "language"},
      {"stream", "1", "stream"},
      {"prompt", "before", "prompt"},
      {"temperature", "-1", "temperature"},
      {"model", "nope", "model"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    const char *fields[] = {bad[i][0], bad[i][1], NULL};
    char *form = audio_form(fields, wav, wav_len, &n);
    struct as_resp r;
    as_post_bytes(s, "/v1/audio/transcriptions", ct, form, n, &r);
    free(form);
    as_check_error(&r, bad[i][2][0] == 'm' ? 404 : 400, bad[i][2]);
    as_resp_free(&r);
  }
  { /* not a clip: the decoder's refusal names the file; no file; not a form */
    const char *none[] = {NULL};
    char *form = audio_form(none, (const uint8_t *)"plain text, not audio", 21, &n);
    struct as_resp r;
    as_post_bytes(s, "/v1/audio/transcriptions", ct, form, n, &r);
    free(form);
    as_check_error(&r, 400, "file");
    as_resp_free(&r);
    const char *only[] = {"temperature", "0", NULL};
    form = audio_form(only, NULL, 0, &n);
    as_post_bytes(s, "/v1/audio/transcriptions", ct, form, n, &r);
    free(form);
    as_check_error(&r, 400, "file");
    as_resp_free(&r);
    as_post(s, "/v1/audio/translations", "{\"file\": \"x\"}", &r);
    TH_CHECK_EQ_INT(r.status, 400);
    as_resp_free(&r);
  }
  free(wav);
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

/* The served answer's tokens are the offline path's on checkpoint ck: the
 * clips' features through wk_audio_g4_encode, the rows over the runs of
 * audio_id (in prompt order, causal: no bidirectional ranges), greedy
 * decoding. */
static void check_offline(const struct as_server *s, const char *ck, const char *body,
                          const struct feats *fs, int n_clips, int audio_id,
                          const struct api_answer *want) {
  char err[512] = "";
  int n = 0;
  int32_t *ids = api_tokenize(s, body, &n);
  struct api_offline o;
  api_offline_open(&o, ck, n);
  struct wk_audio_g4 *a = NULL;
  if (wk_audio_g4_load(ck, o.be, NULL, &a, err, sizeof(err))) {
    th_fail(__FILE__, __LINE__, "audio tower: %s", err);
    th_stop();
  }
  int H = wk_model_config(o.m)->hidden;
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
  int32_t gen[API_GEN];
  api_offline_greedy(&o, ids, n, emb, n_clips, NULL, 0, gen);
  char what[32];
  snprintf(what, sizeof(what), "%d clips", n_clips);
  api_check_tokens(ck, gen, want, what);
  for (int i = 0; i < n_clips; i++)
    free(rows[i]);
  wk_audio_g4_free(a);
  api_offline_close(&o);
  free(ids);
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
    struct api_answer r;
    api_check_prompt(&a, text_only, two, ac->boa_id, ac->audio_id, ac->eoa_id,
                     (const int[]){f[0].tokens, f[1].tokens}, 2, &r);
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
  char *other = chat_body(TEXT, (const char *[]){c1.b64}, 1, NULL, NULL, "What is heard?", 0);
  struct api_answer a1, a2, ai, bi;
  api_check_deterministic(&a, &b, one, two_q, two_s, other, &a1, &a2);
  free(other);
  api_chat(&a, with_image, &ai);
  api_chat(&b, with_image, &bi);
  TH_CHECK_EQ_STR(ai.text, bi.text);
  /* B ran them in chunks */
  TH_CHECK(a1.prompt_tokens > 96 && a2.prompt_tokens > 96 && ai.prompt_tokens > 96);
  fprintf(stderr, "one clip (%d prompt tokens): '%s'\ntwo clips (%d): '%s'\nclip and image: '%s'\n",
          a1.prompt_tokens, a1.text, a2.prompt_tokens, a2.text, ai.text);
  { /* with text-only requests in the same steps: the same answers */
    char *text_q = chat_body(TEXT, NULL, 0, NULL, NULL, "What is heard?", 0);
    struct api_answer t_alone;
    api_chat(&b, text_q, &t_alone);
    const char *paths[4] = {"/v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions",
                            "/v1/chat/completions"};
    const char *bodies[4] = {text_q, one, text_q, two_q};
    struct as_resp rs[4];
    TH_REQUIRE(as_post_many(&b, 4, paths, bodies, rs) == 4);
    struct api_answer got[4];
    for (int i = 0; i < 4; i++) {
      api_parse_answer(&rs[i], &got[i]);
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
    int32_t *ids = api_tokenize(&a, two_q, &n);
    while (first_eoa < n && ids[first_eoa] != ac->eoa_id)
      first_eoa++;
    free(ids);
    double h0 = as_metric(&a, "lmserve:prefix_cache_hits_total");
    struct api_answer again;
    api_chat(&a, two_q, &again);
    double h1 = as_metric(&a, "lmserve:prefix_cache_hits_total");
    TH_CHECK_EQ_STR(again.text, a2.text);
    TH_CHECK(h1 - h0 > (double)first_eoa);
    fprintf(stderr, "prefix hit: %.0f of %d prompt tokens (the first clip ends at %d)\n", h1 - h0,
            again.prompt_tokens, first_eoa);
  }
  check_offline(&a, a.model, one, f, 1, ac->audio_id, &a1);
  check_offline(&a, a.model, two_q, f, 2, ac->audio_id, &a2);

  /* C: a checkpoint whose audio tower an mmproj file can hold (the small one with
     Gemma4AudioConfig's other defaults, 128 mel bins), served from GGUF files as
     export-gguf writes them (--model g/model.gguf --mmproj mmproj-model-f16.gguf):
     its answers are the offline path's on the safetensors checkpoint */
  {
    struct as_server c = {.audio = 1, .audio_defaults = 1, .gguf = 1};
    as_start(&c, 0, (char *[]){"--limit-mm-per-prompt", "image=2,audio=2", NULL});
    char ck[300];
    snprintf(ck, sizeof(ck), "%s/m", c.dir);
    struct md_audio_fe_cfg fe_c;
    TH_REQUIRE(md_audio_fe_load(ck, &fe_c, err, sizeof(err)) == 0);
    TH_CHECK_EQ_INT(fe_c.n_mel, 128);
    struct feats fc[2] = {features(&fe_c, &c0), features(&fe_c, &c1)};
    struct api_answer c1a, c2a;
    api_chat(&c, one, &c1a);
    api_chat(&c, two_q, &c2a);
    TH_CHECK_EQ_INT(c1a.prompt_tokens, a1.prompt_tokens); /* the same ids and clips */
    TH_CHECK_EQ_INT(c2a.prompt_tokens, a2.prompt_tokens);
    fprintf(stderr, "GGUF + mmproj: one clip '%s', two clips '%s'\n", c1a.text, c2a.text);
    check_offline(&c, ck, one, fc, 1, ac->audio_id, &c1a);
    check_offline(&c, ck, two_q, fc, 2, ac->audio_id, &c2a);
    for (int i = 0; i < 2; i++)
      free_feats(&fc[i]);
    as_stop(&c);
  }

  /* (c) bad clips: 400s naming the part; both servers go on */
  {
    size_t len = 0;
    uint8_t *wav = api_wav_f32(c0.x, c0.n, RATE, &len);
    char *t = api_base64(wav, len * 3 / 5); /* the data chunk cut short */
    char *bad = chat_body("Hear:", (const char *[]){t}, 1, NULL, NULL, NULL, 0);
    api_refused(&a, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){c0.b64}, 1, "mp3", NULL, NULL, 0);
    api_refused(&b, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){c0.b64}, 1, "flac", NULL, NULL, 0);
    api_refused(&a, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){"bm90IGF1ZGlvIGF0IGFsbCwganVzdCB0ZXh0"}, 1, NULL,
                    NULL, NULL, 0);
    api_refused(&a, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){"%%%"}, 1, NULL, NULL, NULL, 0);
    api_refused(&b, bad, PART(1));
    free(bad);
    struct clip tiny = make_clip(0, 100.0 / RATE), big = make_clip(1, 30.5);
    bad = chat_body("Hear:", (const char *[]){tiny.b64}, 1, NULL, NULL, NULL, 0);
    api_refused(&a, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){big.b64}, 1, NULL, NULL, NULL, 0);
    api_refused(&b, bad, PART(1));
    free(bad);
    bad = chat_body("Hear:", (const char *[]){c0.b64, c1.b64, c0.b64}, 3, NULL, NULL, NULL, 0);
    api_refused(&a, bad, PART(3));
    api_refused(&b, bad, PART(3));
    free(bad);
    free_clip(&tiny);
    free_clip(&big);
    free(t);
    free(wav);
    api_check_both(&a, &b, two_q, &a2);
  }

  /* (f) /v1/audio/transcriptions and /translations, on A and on B (chunked) */
  char transcript[1024], other_t[1024];
  check_audio_endpoints(&a, &c0, transcript, sizeof(transcript));
  check_audio_endpoints(&b, &c1, other_t, sizeof(other_t));

  /* audio turned off (--limit-mm-per-prompt audio=0): the clip is a 400 naming its
   * part and saying so; images are still taken */
  {
    struct as_server c = {.audio = 1};
    as_start(&c, 0, (char *[]){"--limit-mm-per-prompt", "audio=0", NULL});
    struct as_resp r;
    as_post(&c, "/v1/chat/completions", one, &r);
    as_check_error(&r, 400, PART(1));
    TH_CHECK(r.body && strstr(r.body, "audio is turned off") != NULL);
    as_resp_free(&r);
    char *img_only = chat_body(TEXT, NULL, 0, NULL, url, NULL, 0);
    struct api_answer ok;
    api_chat(&c, img_only, &ok);
    free(img_only);
    as_stop(&c);
  }

  /* (d) the official client (node + node_modules/openai), when present */
  if (th_node_major() < 20 || !th_npm_has("openai")) {
    fprintf(stderr, "SKIP (loudly): node >= 20 or node_modules/openai missing: the openai "
                    "client's audio request did not run\n");
  } else {
    char script[1024], e_url[96], e_text[1100], e_tr[1100], e_model[400];
    snprintf(script, sizeof(script), "%s/integration/api/api-openai-audio.mjs", th_tests_dir());
    snprintf(e_url, sizeof(e_url), "LMSERVE_URL=http://127.0.0.1:%d/v1", b.port);
    snprintf(e_text, sizeof(e_text), "LMSERVE_EXPECT=%s", a1.text);
    snprintf(e_tr, sizeof(e_tr), "LMSERVE_TRANSCRIPT=%s", transcript);
    snprintf(e_model, sizeof(e_model), "LMSERVE_MODEL=%s", b.model); /* the served name */
    char *clip_env = malloc(strlen(c0.b64) + 32);
    TH_REQUIRE(clip_env != NULL);
    sprintf(clip_env, "LMSERVE_AUDIO=%s", c0.b64);
    char *env[] = {e_url, e_model,      clip_env, e_text, "LMSERVE_TEXT=" TEXT,
                   e_tr,  "NO_COLOR=1", NULL};
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
