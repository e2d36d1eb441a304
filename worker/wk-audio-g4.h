/* wk-audio-g4.h — Gemma 4's audio encoder on a kernel backend: the audio
 * tower (Gemma4AudioModel, a Conformer) and the embedder into the text width
 * (Gemma4MultimodalEmbedder) of a Gemma4ForConditionalGeneration checkpoint,
 * turning log-mel features (model/md-audio-g4.h) into soft-token embeddings.
 *
 *   struct wk_audio_g4 *a;
 *   wk_audio_g4_load(dir, be, NULL, &a, err, sizeof err);
 *   struct wk_g4_audio clip = {feat, mask, n_frames, md_audio_soft_tokens(mask, n_frames)};
 *   float *emb = malloc(clip.soft_tokens * wk_audio_g4_text_hidden(a) * 4);
 *   wk_audio_g4_encode(a, &clip, 1, emb, err, sizeof err);
 *   wk_audio_g4_free(a);
 *
 * The math (transformers' modeling_gemma4.py) is written out in
 * wk-audio-g4.c; tests/reference/gemma4_audio_ref.py is its float64 twin.
 * The embeddings of a clip are those of its valid frames after the two
 * stride-2 subsampling convolutions (md_audio_soft_tokens of them), in time
 * order; they replace the audio tokens' embeddings as they are.
 *
 * Weight names (both layouts transformers has saved): model.audio_tower.* and
 * model.embed_audio.*, or audio_tower.* and embed_audio.*. */
#ifndef LMSERVE_WK_AUDIO_G4_H
#define LMSERVE_WK_AUDIO_G4_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/kn-backend.h"
#include "model/md-config.h"

struct wk_audio_g4;

struct wk_audio_g4_opts {
  int max_frames; /* valid feature frames per encoder pass (scratch is sized for
                     it); 0 = one 30 s clip (2999 frames at the default hop) */
};

/* One clip's features, host memory, as md_audio_features gives them. */
struct wk_g4_audio {
  const float *feat;   /* [n_frames][n_mel] */
  const uint8_t *mask; /* [n_frames]: 1 valid, 0 padding */
  int n_frames;
  int soft_tokens; /* md_audio_soft_tokens(mask, n_frames): rows this clip gets */
};

/* Loads the Gemma 4 audio tower of the checkpoint in DIR onto be (which must
 * outlive it). CM_ERR_UNSUPPORTED when the checkpoint has none; otherwise 0
 * or a negative cm_err with a one-line reason naming the tensor. */
int wk_audio_g4_load(const char *dir, struct kn_backend *be, const struct wk_audio_g4_opts *opts,
                     struct wk_audio_g4 **out, char *err, size_t errlen);
void wk_audio_g4_free(struct wk_audio_g4 *a); /* NULL is a no-op */

const struct md_audio_g4_cfg *wk_audio_g4_config(const struct wk_audio_g4 *a);
/* Width of each output embedding: the text model's hidden size. */
int wk_audio_g4_text_hidden(const struct wk_audio_g4 *a);

/* Encodes n clips into out [sum of clips[i].soft_tokens, text_hidden] (host),
 * clip after clip. Only a clip's valid frames run (its padding frames change
 * none of its outputs); clips run as many at a time as max_frames allows (up
 * to 64 a pass); on the CPU backend a clip's rows are the same bits whichever
 * clips share its pass. Refused (CM_ERR_INVAL, naming the clip): a mask that
 * is not valid frames then padding, more valid frames than max_frames, a
 * soft_tokens that is not md_audio_soft_tokens of the mask. 0 or a negative
 * cm_err with the reason in err. */
int wk_audio_g4_encode(struct wk_audio_g4 *a, const struct wk_g4_audio *clips, int n, float *out,
                       char *err, size_t errlen);

#endif
