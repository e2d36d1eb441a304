/* fe-mm.h — image and audio input on the frontend (Gemma 3 and Gemma 4): what
 * the served checkpoint takes, each image_url part turned into the pixels the
 * workers want, each input_audio part into the log-mel features Gemma 4's
 * audio tower takes, and the prompt's placeholders turned into token runs.
 *
 *   struct fe_mm mm;
 *   fe_mm_load(model_dir, NULL, tok, &limits, &mm, err, sizeof err);  // mm.enabled: takes images
 *   on the thread pool, per image part: fe_mm_image(&mm, url, len, &img, err, sizeof err);
 *   after the chat template: fe_mm_expand(&mm, text, len, n_images, &out, &out_len, ...);
 *   after tokenizing:        fe_mm_find_runs(&mm, ids, n, imgs, n_images, ...);
 *   fe_mm_image_free(&img);
 *
 * What Hugging Face's Gemma3Processor does, in the same order: the chat
 * template writes <start_of_image> where each image goes; each of those
 * becomes "\n\n<start_of_image>" + mm_tokens_per_image x <image_soft_token>
 * + "<end_of_image>\n\n" before tokenization; the image itself is resized
 * (Pillow's bilinear, model/md-vision-preproc.h) to the processor's size.
 * The workers rescale and normalise (the 8-bit resized image is a quarter of
 * the float one on the wire).
 *
 * What Gemma4Processor does (transformers' processing_gemma4.py): the chat
 * template writes the image token <|image|> where each image goes (the
 * processor counts tokenizer.image_token in the text); replace_image_token
 * turns each into boi_token + num_soft_tokens x image_token + eoi_token,
 * i.e. <|image> + N x <|image|> + <image|>, nothing around it, N the image's
 * own soft-token count (its aspect-preserving size for max_soft_tokens,
 * model/md-vision-g4.h). The token texts are the tokenizer's for the
 * config's ids. The resized 8-bit image goes with its width and height; the
 * workers cut it into patches.
 *
 * Audio (Gemma 4 with an audio_config; processing_gemma4.py's
 * replace_audio_token): the chat template writes the audio token <|audio|>
 * where each clip goes; each becomes boa + N x audio token + eoa, i.e.
 * <|audio> + N x <|audio|> + <audio|>, N the clip's soft tokens (its feature
 * mask subsampled by the tower's two stride-2 convolutions: 25 a second).
 * fe-audio decodes the part to 16 kHz mono, md-audio-g4 (configured from the
 * checkpoint's processor config) computes the features, and the features
 * with their mask travel to the workers (proto's PR_MEDIA_AUDIO). */
#ifndef LMSERVE_FE_MM_H
#define LMSERVE_FE_MM_H
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-audio.h"
#include "frontend/fe-image.h"
#include "model/md-audio-g4.h"
#include "model/md-config.h"
#include "proto/pr-msg.h"
#include "tokenizer/tk-tokenizer.h"

struct fe_mm {
  int enabled;       /* the checkpoint has a vision tower and images are allowed */
  int g4;            /* 1: Gemma 4's (images of their own size and token count) */
  int limit;         /* images per prompt at most (--limit-mm-per-prompt image=N) */
  int tokens;        /* soft tokens per image (mm_tokens_per_image); Gemma 4: the
                        default budget (vision_config.default_output_length, or the
                        processor config's max_soft_tokens) */
  struct md_vision_g4_cfg g4cfg; /* Gemma 4's tower, what its preprocessing reads */
  int32_t image_id;  /* <image_soft_token> */
  int width, height; /* the processor's size, px */
  int channels;      /* 3 */
  int do_resize;     /* 0: images must come at that size */
  char expansion[64]; /* "\n\n<start_of_image>" ... the text around the soft tokens */
  char boi[32];       /* "<start_of_image>" (Gemma 4: "<|image>") */
  char soft[32];      /* "<image_soft_token>" (Gemma 4: "<|image|>", also the template's marker) */
  char eoi[32];       /* "<end_of_image>" (Gemma 4: "<image|>") */
  struct fe_image_limits lim; /* bytes, pixels, local directory */
  uint64_t hash_key;          /* keys the images' and clips' content hash */
  /* audio: Gemma 4 with an audio tower */
  int audio;                   /* the checkpoint has one and clips are allowed */
  int audio_limit;             /* clips per prompt at most (--limit-mm-per-prompt audio=N) */
  int32_t audio_id;            /* <|audio|>; -1 without audio */
  char boa[32];                /* "<|audio>" */
  char audio_soft[32];         /* "<|audio|>", also the template's marker */
  char eoa[32];                /* "<audio|>" */
  struct fe_audio_limits alim; /* encoded bytes, duration (30 s) */
  struct md_audio_fe_cfg fe;   /* the feature extractor (processor config) */
};

/* The frontend's image and audio options (flags). */
struct fe_mm_opts {
  int limit;              /* images per prompt; < 0: the default (16); 0: images refused */
  int audio_limit;        /* audio clips per prompt; < 0: the default (16); 0: refused */
  size_t max_bytes;       /* per image, encoded; 0: fe-image's default */
  uint64_t max_pixels;    /* per image, decoded; 0: fe-image's default */
  const char *local_dir;  /* --allowed-local-media-path, or NULL */
  int max_soft_tokens;    /* --mm-processor-kwargs' (Gemma 4): each image's budget where a
                             request names none; 0: the checkpoint's */
};

/* --mm-processor-kwargs (vLLM's): a JSON object of the processor's arguments a request
 * leaves out. max_soft_tokens (Gemma 4's image budget: 70, 140, 280, 560 or 1120) into
 * *max_soft_tokens; any other key is refused by name, as a value out of range. 0 or
 * CM_ERR_INVAL with a reason. */
int fe_mm_parse_kwargs(const char *json, int *max_soft_tokens, char *err, size_t errlen);
#define FE_MAIN_MM_KWARGS_HELP                                                                     \
  "the image processor's arguments a request leaves out, as vLLM's flag: '{\"max_soft_tokens\": "  \
  "N}' sets Gemma 4's image budget (70, 140, 280, 560 or 1120 soft tokens)"

/* --limit-mm-per-prompt: "image=N,audio=M" (vLLM's older form, either or
 * both) or {"image": N, "audio": M} (its JSON form); other modalities are
 * refused. A modality not named keeps *image / *audio as they were. 0 or
 * CM_ERR_INVAL with a reason. */
int fe_mm_parse_limit(const char *spec, int *image, int *audio, char *err, size_t errlen);

/* Reads DIR's config.json (and processor configs) through the worker's
 * parser, or takes cfg, the model description already read (a GGUF file's,
 * so that the file is not read again; NULL: read DIR's). A checkpoint without a vision tower, or
 * limit 0, leaves mm->enabled 0; one without an audio tower, or audio_limit 0, leaves mm->audio 0;
 * a broken config is an error naming it. */
int fe_mm_load(const char *dir, const struct md_config *cfg, const struct tk_tokenizer *tok,
               const struct fe_mm_opts *o, struct fe_mm *mm, char *err, size_t errlen);

/* One image, ready for ADD: pixels [height, width, channels] 8-bit, malloc'd.
 * Or one audio clip (fe_mm_audio): pixels holds its features [frames][mels]
 * f32 then its mask [frames] (proto's PR_MEDIA_AUDIO layout), width = mels,
 * height = frames. */
struct fe_mm_image {
  uint8_t *pixels;
  size_t n_bytes;
  uint64_t hash;
  int width, height; /* px of pixels; audio: mel bins and frames */
  int tokens;        /* its soft tokens */
};

/* The most pixel bytes one image may take to the workers with this budget
 * (Gemma 4's max_soft_tokens, 0: the default; Gemma 3: its one size). */
size_t fe_mm_image_max_bytes(const struct fe_mm *mm, int max_soft_tokens);

/* Fetches (data: URL, or file:// under the allowed directory), decodes and
 * resizes the image of one image_url part; Gemma 4 to its size for
 * max_soft_tokens (0: mm->tokens; checked by the caller against the allowed
 * set). 0 or a negative cm_err with a reason for the client in err (without
 * the part's name). Thread-safe. */
int fe_mm_image(const struct fe_mm *mm, const char *url, size_t url_len, int max_soft_tokens,
                struct fe_mm_image *out, char *err, size_t errlen);
void fe_mm_image_free(struct fe_mm_image *img); /* NULL-safe */

/* The most feature bytes one audio clip may take to the workers (a clip of
 * the extractor's max_samples). */
size_t fe_mm_audio_max_bytes(const struct fe_mm *mm);

/* Decodes one input_audio part (its base64 data, format "wav" or "mp3") to the
 * extractor's rate, mono, and computes its features and soft tokens. 0 or a
 * negative cm_err with a reason for the client in err (without the part's
 * name): fe-audio's refusals, or a clip too short for one token. Thread-safe. */
int fe_mm_audio(const struct fe_mm *mm, const char *b64, size_t len, const char *format,
                struct fe_mm_image *out, char *err, size_t errlen);

/* *out (malloc'd) = text with each of its image markers (Gemma 3:
 * <start_of_image>; Gemma 4: <|image|>) expanded to the image's token run,
 * tokens[i] soft tokens for the i-th (NULL: mm->tokens each). The markers
 * must number n_images: CM_ERR_INVAL otherwise, with the reason in err. */
int fe_mm_expand(const struct fe_mm *mm, const char *text, size_t len, size_t n_images,
                 const int *tokens, char **out, size_t *out_len, char *err, size_t errlen);

/* The same for audio: each <|audio|> marker becomes <|audio> + tokens[i] x
 * <|audio|> + <audio|>; the markers must number n_clips. */
int fe_mm_expand_audio(const struct fe_mm *mm, const char *text, size_t len, size_t n_clips,
                       const int *tokens, char **out, size_t *out_len, char *err, size_t errlen);

/* Sets imgs[i].pos / n_tokens to the i-th run of soft tokens in ids (runs of
 * the image token, or of the audio token, in prompt order). The runs must be
 * n_images, the i-th of imgs[i].kind's token (set by the caller: images and
 * clips in prompt order) and of tokens[i] ids (NULL: mm->tokens each):
 * CM_ERR_INVAL otherwise. */
int fe_mm_find_runs(const struct fe_mm *mm, const int32_t *ids, size_t n, struct pr_image *imgs,
                    size_t n_images, const int *tokens, char *err, size_t errlen);

#endif
