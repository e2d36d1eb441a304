/* tl-tiny-spec.h — the shapes, configs and seeded random weights of
 * generated checkpoints (`lmserve make-tiny-model`, and tests that need a
 * model on disk). The Hugging Face field and tensor names used are listed at
 * the top of tools/tl-make-tiny-model.c. */
#ifndef LMSERVE_TL_TINY_SPEC_H
#define LMSERVE_TL_TINY_SPEC_H
#include <stdint.h>

#include "model/md-config.h"
#include "model/md-safetensors.h"

enum tl_init {
  TL_INIT_NORMAL = 0,      /* N(0, a^2) */
  TL_INIT_AROUND = 1,      /* b + N(0, a^2) (norm weights) */
  TL_INIT_UNIFORM = 2,     /* U(a, b) */
  TL_INIT_PERMUTATION = 3, /* a random permutation of 0..n-1, I64 */
  TL_INIT_CLUSTERED = 4,   /* rows [V, H]: a * (u[v / per] + r[v]), u and r N(0, 1) drawn from
                            * a fixed stream (not the file's seed): the same in every file */
  TL_INIT_CENTROIDS = 5,   /* rows [V / per, H]: the u of TL_INIT_CLUSTERED, times a */
  TL_INIT_EYE = 6,         /* [out, in]: 1 where out == in, else 0 */
  TL_INIT_ARANGE = 7,      /* 0, 1, .. n-1 (I64) */
};

struct tl_tensor_spec {
  char name[160];
  struct md_st_entry e; /* e.name is set when written */
  enum tl_init init;
  double a, b;
  int per; /* TL_INIT_CLUSTERED / TL_INIT_CENTROIDS: rows per cluster */
};

struct tl_tiny_spec {
  char model_type[32];
  int vocab;                      /* tokens */
  char *config_json;              /* malloc'd config.json text */
  char *generation_json;          /* malloc'd generation_config.json text, or NULL */
  char *preproc_json;             /* malloc'd preprocessor_config.json text, or NULL */
  int preproc_nested;             /* 1: preproc_json is processor_config.json (Gemma 4) */
  struct tl_tensor_spec *tensors; /* in file order */
  int n_tensors, cap;
  int rig;            /* 0; 1: echo target; 2: assistant agreeing with one */
  double rig_leak;    /* echo target: its post norms' weight (0: a pure echo) */
  double router_gain; /* MoE routers' weights times this (0 or 1: the default spread) */
};

/* Options of a generated gemma3 / gemma4 model. */
struct tl_tiny_opts {
  const char *arch;   /* "gemma3" | "gemma4" */
  const char *preset; /* "tiny" | "270m" (gemma3) | "e2b" (gemma4) */
  int vocab;          /* tokens; 262144 matches the Gemma tokenizer */
  int moe;            /* gemma4: MoE block in every layer */
  double router_gain; /* moe: the routers' weights this many times the default spread
                       * (0 = 1), so that routing is decisive as a trained router's is:
                       * at 1 the router logits of the tiny presets lie within about
                       * 0.1 of each other and the top-k choice turns on the last bits */
  int sliding_window; /* 0 = the preset's (64 for tiny) */
  int ffn;            /* gemma3: the MLPs' intermediate size, 0 = the preset's */
  int moe_ffn;        /* gemma4 moe: the experts' intermediate size, 0 = 32 */
  int echo;           /* gemma4: see tl_tiny_spec_assistant_agreeing */
  double echo_leak;   /* echo: post norms at this weight instead of 0, so that the
                       * context moves some greedy tokens off the echo (an
                       * assistant that agrees only partly) */
  int vision;         /* gemma3: a Gemma3ForConditionalGeneration checkpoint with a
                       * small SigLIP tower (64 px images, 8 px patches, 2 layers,
                       * hidden 32, 4 heads, 16 soft tokens per image) and the
                       * projector; a vocabulary of 262144 (the tokenizer's base)
                       * becomes 262208 (Gemma 3's, covering <image_soft_token>
                       * 262144); a smaller one puts the image token ids at its end.
                       * With the 270m preset the tower is SigLIP-So400m-shaped
                       * (896 px, 14 px patches, 27 x 1152, 256 soft tokens).
                       * gemma4: a Gemma4ForConditionalGeneration checkpoint with
                       * a small Gemma 4 vision tower (2 layers, hidden 32, 4
                       * heads of 16 over 2 KV heads, clipped linears,
                       * standardisation) and its embedder, processor_config.json
                       * for 280 soft tokens; with the e2b preset the tower is
                       * E2B's (16 x 768, 12 heads of 64) */
  int bidir_vision;   /* gemma4 with vision: text_config.use_bidirectional_attention
                       * "vision" (md_image_bidir says where it applies) */
  int audio;          /* gemma4: a Gemma4ForConditionalGeneration checkpoint with a
                       * small Gemma 4 audio tower (2 layers of 32, 4 heads, chunks
                       * of 4 frames, 16 mel bins, clipped linears and clamps that
                       * bite) and its embedder, the feature extractor's fields in
                       * processor_config.json. Combines with vision. */
  int audio_e2b;      /* with audio: E2B's tower instead (Gemma4AudioConfig's
                       * defaults: 12 layers of 1024, 128 mel bins), whatever the
                       * text preset; make-tiny-model sets it for the e2b preset or
                       * --audio-shape e2b */
  int audio_defaults; /* with audio: the small tower's sizes with Gemma4AudioConfig's
                       * other defaults (chunks of 12, 13 frames of left context,
                       * none right, eps 1e-6, no gradient clip, channels [128, 32])
                       * and the feature extractor's (128 mel bins): what an mmproj
                       * file can hold; --audio-shape tiny-default */
};

int tl_tiny_spec_build(struct tl_tiny_spec *s, const struct tl_tiny_opts *o, char *err,
                       size_t errlen);
/* A gemma4_assistant paired with the target's config (backbone hidden size,
 * vocabulary, KV heads and head dims per layer type). */
int tl_tiny_spec_assistant(struct tl_tiny_spec *s, const struct md_config *target, char *err,
                           size_t errlen);
/* A rigged pair for speculative-decoding tests and benchmarks. An `echo`
 * target (tl_tiny_opts.echo) has every layer's post norms (attention, MLP,
 * per-layer input) at zero, so its residual stream is the scaled embedding
 * of the current token whatever the context, and a clustered embedding
 * (rows near one of V / per cluster directions, per as the assistant's
 * ordered embedding): its greedy next token is the current token (the
 * largest self-similarity). The agreeing assistant has hidden size = the
 * target's, pre_projection = [I 0] (the embedding half), zero post norms, the
 * same clustered embedding, the cluster directions as centroids and the
 * identity token ordering: its drafts reproduce the echo target's greedy
 * tokens. All of the compute of both models still runs; only the values are
 * rigged. */
int tl_tiny_spec_assistant_agreeing(struct tl_tiny_spec *s, const struct md_config *target,
                                    char *err, size_t errlen);
void tl_tiny_spec_free(struct tl_tiny_spec *s);

/* Writes config.json, generation_config.json and model.safetensors (weights
 * of dtype dt: MD_ST_BF16, MD_ST_F16 or MD_ST_F32) into the existing
 * directory `dir`. Each tensor's values depend only on (seed, its index). */
int tl_tiny_write(const struct tl_tiny_spec *s, const char *dir, uint64_t seed,
                  enum md_st_dtype dt);

#endif
