/* tl-bench-vision.c — `lmserve bench vision`: the image path on the CPU
 * backend of one checkpoint with a vision tower (Gemma 3's SigLIP, or Gemma 4's
 * tower at --max-soft-tokens).
 *
 *   images/s   SigLIP tower + projector, --batch images per encoder pass
 *              (preprocessed pixels in, soft-token embeddings out);
 *   TTFT       one image from 8-bit pixels of --source-size to the first token:
 *              resize (Pillow's bilinear) to the processor's size, rescale and
 *              normalise, encode, then prefill a chat prompt with the image's
 *              token run in the middle (its rows replaced, its tokens attending
 *              to each other both ways) and pick the greedy token. Gemma 4: the
 *              frontend's half (md_g4_image_resize: Pillow's bicubic to the
 *              budget's size) and the worker's (md_g4_image_patches), then the
 *              same; its tokens see each other both ways in the layers
 *              md_image_bidir names.
 * What the TTFT leaves out: HTTP, image decoding (PNG / JPEG) and
 * tokenization, which the frontend does off the engine's path.
 *
 * A Gemma 4 checkpoint with an audio tower adds (after the images, or alone):
 *   audio      seconds of audio encoded per second: --batch clips of
 *              --audio-seconds (log-mel features in, soft-token embeddings
 *              out); the features' own time printed beside it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-args.h"
#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-time.h"
#include "kernels/cpu/kn-cpu.h"
#include "model/md-audio-g4.h"
#include "model/md-config.h"
#include "model/md-vision-g4.h"
#include "model/md-vision-preproc.h"
#include "tools/tl-main.h"
#include "worker/wk-audio-g4.h"
#include "worker/wk-kv.h"
#include "worker/wk-model.h"
#include "worker/wk-vision-g4.h"
#include "worker/wk-vision.h"

static uint32_t lcg(uint32_t *s) {
  return (*s = *s * 1664525u + 1013904223u) >> 8;
}

/* One prefill of toks[T] with the image's n soft tokens at `at` replaced by emb
 * and seeing each other both ways; the greedy token's time is the caller's. */
static int prefill(struct wk_model *m, struct wk_page_alloc *pa, struct wk_seq_blocks *blk,
                   const int32_t *toks, int T, int at, int n, const float *emb, char *err,
                   size_t errlen) {
  const struct wk_kv_spec *kv = wk_model_kv_spec(m);
  wk_seq_blocks_release(blk, kv, pa);
  int rc = wk_seq_blocks_reserve(blk, kv, pa, T);
  if (rc) {
    snprintf(err, errlen, "KV blocks for %d tokens: %s", T, cm_strerror(rc));
    return rc;
  }
  int32_t bidir[2] = {at, at + n};
  struct wk_seq_embed e = {at, n, emb};
  struct wk_seq_input s = {.tokens = toks,
                           .n_tokens = T,
                           .pos0 = 0,
                           .n_out = 1,
                           .bidir = bidir,
                           .n_bidir = 1,
                           .embeds = &e,
                           .n_embeds = 1};
  for (int g = 0; g < kv->n_groups; g++) {
    s.block_tables[g] = blk->table[g];
    s.n_blocks[g] = blk->n[g];
  }
  struct kn_sample_params sp = {
      .top_p = 1, .repetition_penalty = 1, .n_logprobs = -1, .seed = 1, .counter = (uint64_t)T};
  struct kn_sample_out out;
  struct wk_batch bt = {.seqs = &s, .n_seqs = 1, .sample = &sp, .sampled = &out};
  return wk_model_forward(m, &bt, err, errlen);
}

/* A prompt of T random ids (from 1000, below 1000 + span) opening with bos,
 * with N image ids from at on between boi and eoi. */
static void fill_prompt(int32_t *toks, int T, int at, int N, uint32_t span, int32_t bos,
                        int32_t boi, int32_t image, int32_t eoi, uint32_t *seed) {
  for (int i = 0; i < T; i++)
    toks[i] = (int32_t)(lcg(seed) % span) + 1000;
  toks[0] = bos;
  toks[at - 1] = boi;
  for (int i = 0; i < N; i++)
    toks[at + i] = image;
  toks[at + N] = eoi;
}

/* The TTFT's stages (resize, patches or normalisation, encode, prefill)
 * summed over the timed passes, and the best whole pass. */
struct ttft {
  double stage[4], best;
};

/* A timed pass from its five clock readings (before each stage, after the last). */
static void ttft_add(struct ttft *t, const double clock[5]) {
  for (int i = 0; i < 4; i++)
    t->stage[i] += clock[i + 1] - clock[i];
  if (clock[4] - clock[0] < t->best) t->best = clock[4] - clock[0];
}

/* The text model m (NULL: none) with its pages and a sequence's blocks. */
static void free_text(struct wk_model *m, struct wk_seq_blocks *blk, struct wk_page_alloc *pa) {
  if (m) wk_seq_blocks_release(blk, wk_model_kv_spec(m), pa);
  wk_page_alloc_free(pa);
  wk_model_free(m);
}

/* The model (and its model_type, when not NULL) and the backend. */
static void print_setup(const char *model, const char *type, struct kn_backend *be,
                        long long threads) {
  if (type)
    printf("model        %s (%s)\n", model, type);
  else
    printf("model        %s\n", model);
  printf("backend      %s (%s), %lld threads\n", kn_backend_name(be),
         kn_cpu_isa_name(kn_cpu_isa_detect()), threads);
}

/* Gemma 4's tower: images/s of batch src x src images at max_soft_tokens per
 * encoder pass, and the TTFT of one. */
static int bench_g4(const char *model, struct kn_backend *be, int threads, int batch, int iters,
                    int src, int text, int mst) {
  char err[512] = "";
  int status = 1, rc;
  struct wk_vision_g4 *v = NULL;
  struct wk_model *m = NULL;
  struct md_config *cfg = malloc(sizeof(*cfg));
  struct md_vision_g4_cfg vc;
  struct md_g4_image plan;
  struct wk_page_alloc pa = {0};
  struct wk_seq_blocks blk = {0};
  uint8_t *img = NULL, *resized = NULL;
  float *px = NULL, *emb = NULL;
  int32_t *pos = NULL, *toks = NULL;
  struct wk_g4_image *ims = NULL;
  if (!cfg) goto nomem;
  if ((rc = md_config_load(model, cfg, err, sizeof(err)))) goto fail;
  vc = cfg->vision_g4;
  if ((rc = md_g4_image_plan(&plan, src, src, &vc, mst, err, sizeof(err)))) goto fail;
  struct wk_vision_g4_opts vo = {.max_patches = plan.n_patches * batch};
  if ((rc = wk_vision_g4_load(model, be, &vo, &v, err, sizeof(err)))) goto fail;
  int H = wk_vision_g4_text_hidden(v), N = plan.soft_tokens;
  img = malloc((size_t)src * (size_t)src * 3);
  px = malloc(sizeof(float) * (size_t)plan.n_patches * (size_t)plan.patch_dim);
  pos = malloc(sizeof(int32_t) * 2 * (size_t)plan.n_patches);
  emb = malloc(sizeof(float) * (size_t)N * (size_t)H * (size_t)batch);
  ims = calloc((size_t)batch, sizeof(*ims));
  if (!img || !px || !pos || !emb || !ims) goto nomem;
  uint32_t seed = 7;
  for (size_t i = 0; i < (size_t)src * (size_t)src * 3; i++)
    img[i] = (uint8_t)lcg(&seed);
  struct md_g4_image info;
  if ((rc = md_g4_image_resize(&resized, &info, img, src, src, &vc, mst, err, sizeof(err))) ||
      (rc = md_g4_image_patches(px, pos, &info, resized, info.width, info.height, &vc, err,
                                sizeof(err))))
    goto fail;
  for (int b = 0; b < batch; b++)
    ims[b] = (struct wk_g4_image){px, pos, info};
  /* images/s: a warm-up pass, then iters timed ones */
  if ((rc = wk_vision_g4_encode(v, ims, batch, emb, err, sizeof(err)))) goto fail;
  double t0 = cm_time_s();
  for (int i = 0; i < iters; i++)
    if ((rc = wk_vision_g4_encode(v, ims, batch, emb, err, sizeof(err)))) goto fail;
  double t_enc = (cm_time_s() - t0) / (double)iters;

  /* TTFT: the text model beside the tower */
  int T = text + N + 2; /* text, <|image>, soft tokens, <image|> */
  struct wk_model_opts mo = {.max_batch_tokens = T, .max_seqs = 1, .kv_tokens = T + 16};
  if ((rc = wk_model_load(model, be, &mo, &m, err, sizeof(err)))) goto fail;
  const struct md_config *c = wk_model_config(m);
  toks = malloc(sizeof(int32_t) * (size_t)T);
  if (!toks || wk_page_alloc_init(&pa, wk_model_n_pages(m))) goto nomem;
  int at = text / 2 + 1; /* the soft tokens' first position */
  fill_prompt(toks, T, at, N, (uint32_t)(c->vocab - 1000), c->bos_id, vc.boi_id, vc.image_id,
              vc.eoi_id, &seed);
  struct ttft tt = {.best = INFINITY};
  for (int it = 0; it <= iters; it++) { /* pass 0 warms up */
    double clock[5];
    clock[0] = cm_time_s();
    free(resized);
    resized = NULL;
    if ((rc = md_g4_image_resize(&resized, &info, img, src, src, &vc, mst, err, sizeof(err))))
      goto fail;
    clock[1] = cm_time_s();
    if ((rc = md_g4_image_patches(px, pos, &info, resized, info.width, info.height, &vc, err,
                                  sizeof(err))))
      goto fail;
    clock[2] = cm_time_s();
    struct wk_g4_image one = {px, pos, info};
    if ((rc = wk_vision_g4_encode(v, &one, 1, emb, err, sizeof(err)))) goto fail;
    clock[3] = cm_time_s();
    if ((rc = prefill(m, &pa, &blk, toks, T, at, N, emb, err, sizeof(err)))) goto fail;
    clock[4] = cm_time_s();
    if (it > 0) ttft_add(&tt, clock);
  }
  double k = (double)iters;
  print_setup(model, c->model_type, be, threads);
  printf("tower        Gemma 4: %d layers x %d, %d px patches; a %dx%d image at %d soft tokens: "
         "%dx%d px, %d patches, %d soft tokens of width %d\n",
         vc.n_layers, vc.hidden, vc.patch, src, src, mst ? mst : vc.default_tokens, info.width,
         info.height, info.n_patches, N, H);
  printf("encoder      %.4g images/s (%d per pass, %.1f ms per pass)\n", (double)batch / t_enc,
         batch, t_enc * 1e3);
  printf("ttft         %.1f ms mean, %.1f ms best: resize %dx%d -> %dx%d %.1f ms, patches "
         "%.1f ms, encode %.1f ms, prefill %d tokens %.1f ms\n",
         (tt.stage[0] + tt.stage[1] + tt.stage[2] + tt.stage[3]) / k * 1e3, tt.best * 1e3, src, src,
         info.width, info.height, tt.stage[0] / k * 1e3, tt.stage[1] / k * 1e3,
         tt.stage[2] / k * 1e3, T, tt.stage[3] / k * 1e3);
  status = 0;
  goto done;
fail:
  fprintf(stderr, "lmserve bench vision: %s\n", err[0] ? err : cm_strerror(rc));
  goto done;
nomem:
  fprintf(stderr, "lmserve bench vision: out of memory\n");
done:
  free_text(m, &blk, &pa);
  free(img), free(resized), free(px), free(pos), free(emb), free(ims), free(toks), free(cfg);
  wk_vision_g4_free(v);
  return status;
}

/* Gemma 4's audio tower: seconds of audio encoded per second, batch clips
 * of `seconds` each per encoder pass (log-mel features in, soft-token
 * embeddings out; the features' own time apart). */
static int bench_audio(const char *model, struct kn_backend *be, int threads, int batch, int iters,
                       double seconds) {
  char err[512] = "";
  int status = 1, rc;
  struct wk_audio_g4 *a = NULL;
  struct md_audio_fe_cfg fe;
  float *pcm = NULL, *feat = NULL, *emb = NULL;
  uint8_t *mask = NULL;
  struct wk_g4_audio *clips = NULL;
  if ((rc = md_audio_fe_load(model, &fe, err, sizeof(err)))) goto fail;
  size_t n = (size_t)(seconds * fe.sampling_rate), nf = md_audio_fe_frames(&fe, n);
  if (!nf) {
    snprintf(err, sizeof(err), "%.3g s of audio gives no frames", seconds);
    goto fail;
  }
  struct wk_audio_g4_opts ao = {.max_frames = (int)nf * batch};
  if ((rc = wk_audio_g4_load(model, be, &ao, &a, err, sizeof(err)))) goto fail;
  pcm = malloc(sizeof(float) * n);
  feat = malloc(sizeof(float) * nf * (size_t)fe.n_mel);
  mask = malloc(nf);
  clips = calloc((size_t)batch, sizeof(*clips));
  if (!pcm || !feat || !mask || !clips) {
    rc = CM_ERR_NOMEM;
    goto fail;
  }
  uint32_t seed = 7;
  for (size_t i = 0; i < n; i++)
    pcm[i] = (float)(lcg(&seed) % 2001) / 4000.0f - 0.25f;
  double f0 = cm_time_s();
  if ((rc = md_audio_features(&fe, pcm, n, feat, mask))) goto fail;
  double t_feat = cm_time_s() - f0;
  int N = md_audio_soft_tokens(mask, nf), H = wk_audio_g4_text_hidden(a);
  for (int b = 0; b < batch; b++)
    clips[b] = (struct wk_g4_audio){feat, mask, (int)nf, N};
  emb = malloc(sizeof(float) * (size_t)N * (size_t)H * (size_t)batch);
  if (!emb) {
    rc = CM_ERR_NOMEM;
    goto fail;
  }
  /* a warm-up pass, then iters timed ones */
  if ((rc = wk_audio_g4_encode(a, clips, batch, emb, err, sizeof(err)))) goto fail;
  double t0 = cm_time_s();
  for (int i = 0; i < iters; i++)
    if ((rc = wk_audio_g4_encode(a, clips, batch, emb, err, sizeof(err)))) goto fail;
  double t_enc = (cm_time_s() - t0) / (double)iters;
  const struct md_audio_g4_cfg *ac = wk_audio_g4_config(a);
  print_setup(model, NULL, be, threads);
  printf("audio tower  Gemma 4: %d layers x %d, %d heads, chunks of %d frames, %d mel bins; a "
         "%.3g s clip: %zu frames, %d soft tokens of width %d\n",
         ac->n_layers, ac->hidden, ac->n_heads, ac->chunk, fe.n_mel, seconds, nf, N, H);
  printf("audio        %.4g s of audio encoded per s (%d clips per pass, %.1f ms per pass; the "
         "features %.1f ms a clip)\n",
         seconds * batch / t_enc, batch, t_enc * 1e3, t_feat * 1e3);
  status = 0;
fail:
  if (status) fprintf(stderr, "lmserve bench vision: %s\n", err[0] ? err : cm_strerror(rc));
  free(pcm), free(feat), free(mask), free(clips), free(emb);
  wk_audio_g4_free(a);
  return status;
}

int tl_bench_vision_main(int argc, char **argv) {
  const char *model = NULL, *mmproj = NULL;
  int64_t threads = 0, batch = 1, iters = 3, src = 1024, text = 32, mst = 0;
  double seconds = 30;
  const struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &model, "DIR",
       "a Gemma3ForConditionalGeneration or Gemma4ForConditionalGeneration checkpoint, or a "
       "GGUF model with its towers (llama.cpp's mmproj file)"},
      {"mmproj", CM_OPT_STR, &mmproj, "FILE", MD_MMPROJ_HELP},
      {"max-soft-tokens", CM_OPT_INT, &mst, "N",
       "Gemma 4: soft tokens per image, 70, 140, 280, 560 or 1120 (default: the config's)", 0,
       1120},
      {"batch", CM_OPT_INT, &batch, "N", "images per encoder pass (default 1)", 1, 64},
      {"iters", CM_OPT_INT, &iters, "N", "timed passes (default 3)", 1, 1000},
      {"source-size", CM_OPT_INT, &src, "PX", "side of the TTFT's source image (default 1024)", 1,
       16384},
      {"text-tokens", CM_OPT_INT, &text, "N", "text tokens around the image (default 32)", 2,
       1 << 16},
      {"threads", CM_OPT_INT, &threads, "N", "CPU threads (default: one per core)", 0, 1024},
      {"audio-seconds", CM_OPT_DOUBLE, &seconds, "S",
       "Gemma 4 with an audio tower: seconds of each clip (default 30; --batch clips a pass)", 0, 0,
       0.01, 30},
      {0},
  };
  int rc = tl_args_parse("lmserve bench vision",
                         "image encoder throughput and time to first token of one image; Gemma "
                         "4's audio encoder throughput",
                         opts, argc, argv);
  if (rc >= 0) return rc;
  if (!model) {
    fprintf(stderr, "lmserve bench vision: --model DIR is required\n");
    return 2;
  }
  char why[512];
  if (md_model_mmproj_arg(model, mmproj, why, sizeof(why))) {
    fprintf(stderr, "lmserve bench vision: %s\n", why);
    return 2;
  }
  if (threads == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores > 0 ? cores : 1;
  }
  int status = 1;
  char err[512] = "";
  struct kn_backend *be = NULL;
  struct wk_model *m = NULL;
  struct wk_vision *v = NULL;
  float *px = NULL, *emb = NULL;
  uint8_t *img = NULL, *resized = NULL;
  int32_t *toks = NULL;
  struct wk_page_alloc pa = {0};
  struct wk_seq_blocks blk = {0};
  if ((rc = kn_cpu_backend_create((int)threads, &be))) {
    fprintf(stderr, "lmserve bench vision: CPU backend: %s\n", cm_strerror(rc));
    goto done;
  }
  struct md_config *probe = malloc(sizeof(*probe));
  int loaded = probe && md_config_load(model, probe, err, sizeof(err)) == 0;
  int g4 = loaded && probe->vision_g4.present, audio = loaded && probe->audio_g4.present;
  free(probe);
  err[0] = 0;
  if (g4 || audio) {
    status = g4 ? bench_g4(model, be, (int)threads, (int)batch, (int)iters, (int)src, (int)text,
                           (int)mst)
                : 0;
    if (!status && audio)
      status = bench_audio(model, be, (int)threads, (int)batch, (int)iters, seconds);
    goto done;
  }
  struct wk_vision_opts vo = {.max_images = (int)batch};
  if ((rc = wk_vision_load(model, be, &vo, &v, err, sizeof(err)))) {
    fprintf(stderr, "lmserve bench vision: %s\n", err);
    goto done;
  }
  const struct md_vision_cfg *vc = wk_vision_config(v);
  int S = vc->image_size, C = vc->channels, H = wk_vision_text_hidden(v), N = vc->mm_tokens;
  size_t plane = (size_t)C * S * S;
  px = malloc(sizeof(float) * plane * (size_t)batch);
  emb = malloc(sizeof(float) * (size_t)N * H * (size_t)batch);
  if (!px || !emb) goto nomem;
  uint32_t seed = 7;
  for (size_t i = 0; i < plane * (size_t)batch; i++)
    px[i] = (float)(lcg(&seed) % 2001) / 1000.0f - 1.0f;

  /* images/s: a warm-up pass, then iters timed ones */
  if ((rc = wk_vision_encode(v, px, (int)batch, emb, err, sizeof(err)))) goto fail;
  double t0 = cm_time_s();
  for (int i = 0; i < iters; i++)
    if ((rc = wk_vision_encode(v, px, (int)batch, emb, err, sizeof(err)))) goto fail;
  double t_enc = (cm_time_s() - t0) / (double)iters;

  /* TTFT: the text model beside the tower */
  int T = (int)text + N + 8; /* text, "\n\n<boi>", soft tokens, "<eoi>\n\n", the turn's end */
  struct wk_model_opts mo = {.max_batch_tokens = T, .max_seqs = 1, .kv_tokens = T + 16};
  if ((rc = wk_model_load(model, be, &mo, &m, err, sizeof(err)))) {
    fprintf(stderr, "lmserve bench vision: %s\n", err);
    goto done;
  }
  const struct md_config *c = wk_model_config(m);
  toks = malloc(sizeof(int32_t) * (size_t)T);
  img = malloc((size_t)src * (size_t)src * (size_t)C);
  resized = malloc((size_t)S * S * (size_t)C);
  if (!toks || !img || !resized || wk_page_alloc_init(&pa, wk_model_n_pages(m))) goto nomem;
  for (size_t i = 0; i < (size_t)src * (size_t)src * (size_t)C; i++)
    img[i] = (uint8_t)lcg(&seed);
  int at = (int)text / 2 + 2; /* the soft tokens' first position */
  fill_prompt(toks, T, at, N, 200000u, c->bos_id, vc->boi_id, vc->image_id, vc->eoi_id, &seed);
  struct ttft tt = {.best = INFINITY};
  for (int it = 0; it <= iters; it++) { /* pass 0 warms up */
    double clock[5];
    clock[0] = cm_time_s();
    if ((rc = md_image_resize_bilinear(resized, S, S, img, (int)src, (int)src, C))) goto fail_rc;
    clock[1] = cm_time_s();
    struct md_preproc_cfg pre = vc->pre;
    pre.do_resize = 0;
    if ((rc = md_image_preprocess(px, resized, S, S, C, &pre, err, sizeof(err)))) goto fail;
    clock[2] = cm_time_s();
    if ((rc = wk_vision_encode(v, px, 1, emb, err, sizeof(err)))) goto fail;
    clock[3] = cm_time_s();
    if ((rc = prefill(m, &pa, &blk, toks, T, at, N, emb, err, sizeof(err)))) goto fail;
    clock[4] = cm_time_s();
    if (it > 0) ttft_add(&tt, clock);
  }
  double k = (double)iters;
  print_setup(model, c->model_type, be, (long long)threads);
  printf("tower        %d px, %d px patches, %d layers x %d, %d soft tokens of width %d\n", S,
         vc->patch, vc->n_layers, vc->hidden, N, H);
  printf("encoder      %.4g images/s (%lld per pass, %.1f ms per pass)\n", (double)batch / t_enc,
         (long long)batch, t_enc * 1e3);
  printf("ttft         %.1f ms mean, %.1f ms best: resize %lldx%lld -> %d %.1f ms, normalise "
         "%.1f ms, encode %.1f ms, prefill %d tokens %.1f ms\n",
         (tt.stage[0] + tt.stage[1] + tt.stage[2] + tt.stage[3]) / k * 1e3, tt.best * 1e3,
         (long long)src, (long long)src, S, tt.stage[0] / k * 1e3, tt.stage[1] / k * 1e3,
         tt.stage[2] / k * 1e3, T, tt.stage[3] / k * 1e3);
  status = 0;
  goto done;
fail_rc:
  snprintf(err, sizeof(err), "%s", cm_strerror(rc));
fail:
  fprintf(stderr, "lmserve bench vision: %s\n", err);
  goto done;
nomem:
  fprintf(stderr, "lmserve bench vision: out of memory\n");
done:
  free_text(m, &blk, &pa);
  free(toks);
  free(img);
  free(resized);
  free(px);
  free(emb);
  wk_vision_free(v);
  kn_backend_destroy(be);
  return status;
}
