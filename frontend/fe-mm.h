/* fe-mm.h — image input on the frontend (Gemma 3 and Gemma 4): what the served
 * checkpoint takes, each image_url part turned into the pixels the workers
 * want, and the prompt's image placeholders turned into token runs.
 *
 *   struct fe_mm mm;
 *   fe_mm_load(model_dir, tok, &limits, &mm, err, sizeof err);  // mm.enabled: takes images
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
 * workers cut it into patches. */
#ifndef LMSERVE_FE_MM_H
#define LMSERVE_FE_MM_H
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe-image.h"
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
  uint64_t hash_key;          /* keys the images' content hash */
};

/* The frontend's image options (flags). */
struct fe_mm_opts {
  int limit;              /* images per prompt; < 0: the default (16); 0: images refused */
  size_t max_bytes;       /* per image, encoded; 0: fe-image's default */
  uint64_t max_pixels;    /* per image, decoded; 0: fe-image's default */
  const char *local_dir;  /* --allowed-local-media-path, or NULL */
};

/* --limit-mm-per-prompt: "image=N" (vLLM's older form) or {"image": N} (its
 * JSON form); other modalities are refused. 0 or CM_ERR_INVAL with a reason. */
int fe_mm_parse_limit(const char *spec, int *limit, char *err, size_t errlen);

/* Reads DIR's config.json (and preprocessor config) through the worker's
 * parser. A checkpoint without a vision tower, or limit 0, leaves
 * mm->enabled 0 and returns 0; a broken config is an error naming it. */
int fe_mm_load(const char *dir, const struct tk_tokenizer *tok, const struct fe_mm_opts *o,
               struct fe_mm *mm, char *err, size_t errlen);

/* One image, ready for ADD: pixels [height, width, channels] 8-bit, malloc'd. */
struct fe_mm_image {
  uint8_t *pixels;
  size_t n_bytes;
  uint64_t hash;
  int width, height; /* px of pixels */
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

/* *out (malloc'd) = text with each of its image markers (Gemma 3:
 * <start_of_image>; Gemma 4: <|image|>) expanded to the image's token run,
 * tokens[i] soft tokens for the i-th (NULL: mm->tokens each). The markers
 * must number n_images: CM_ERR_INVAL otherwise, with the reason in err. */
int fe_mm_expand(const struct fe_mm *mm, const char *text, size_t len, size_t n_images,
                 const int *tokens, char **out, size_t *out_len, char *err, size_t errlen);

/* Sets imgs[i].pos / n_tokens to the i-th run of soft tokens in ids. The runs
 * must be n_images, the i-th of tokens[i] ids (NULL: mm->tokens each):
 * CM_ERR_INVAL otherwise. */
int fe_mm_find_runs(const struct fe_mm *mm, const int32_t *ids, size_t n, struct pr_image *imgs,
                    size_t n_images, const int *tokens, char *err, size_t errlen);

#endif
