/* md-config.h — a model's architecture, parsed from Hugging Face config.json.
 *
 * Accepted model_type values and where their fields live:
 *   gemma3_text        top level (Gemma3ForCausalLM checkpoints)
 *   gemma3             text settings nested under "text_config" (multimodal);
 *                      "vision_config" (SigLIP), "mm_tokens_per_image",
 *                      "boi_token_index", "eoi_token_index", "image_token_index"
 *                      at top level (struct md_vision_cfg)
 *   gemma4_text        top level
 *   gemma4             nested under "text_config"; "vision_config"
 *                      (gemma4_vision), "boi_token_id", "eoi_token_id",
 *                      "image_token_id" at top level (struct md_vision_g4_cfg;
 *                      the tower: worker/wk-vision-g4.h); "audio_config"
 *                      (gemma4_audio), "audio_token_id", "boa_token_id",
 *                      "eoa_token_index" (struct md_audio_g4_cfg; the tower:
 *                      worker/wk-audio-g4.h)
 *   gemma4_assistant   MTP draft model: "backbone_hidden_size",
 *                      "use_ordered_embeddings", "num_centroids",
 *                      "centroid_intermediate_top_k" at top level, the stack
 *                      under "text_config" (every layer KV-shared)
 *
 * Both generations of fields are read:
 *   older: "sliding_window_pattern", "rope_theta", "rope_local_base_freq",
 *          "rope_scaling" {"rope_type"|"type": "linear", "factor"}
 *   newer: "layer_types" ["sliding_attention"|"full_attention", ...],
 *          "rope_parameters" {"sliding_attention": {...}, "full_attention": {...}}
 *          each {"rope_type": "default"|"linear"|"proportional", "rope_theta",
 *          "factor", "partial_rotary_factor"}
 * Other fields: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head_dim, global_head_dim,
 * num_global_key_value_heads, query_pre_attn_scalar, sliding_window,
 * max_position_embeddings, rms_norm_eps, attn_logit_softcapping,
 * final_logit_softcapping, attention_k_eq_v, num_kv_shared_layers,
 * use_double_wide_mlp, hidden_size_per_layer_input, vocab_size_per_layer_input,
 * enable_moe_block, num_experts, top_k_experts, moe_intermediate_size,
 * hidden_activation, tie_word_embeddings, eos_token_id, bos_token_id,
 * pad_token_id. Anything structural that is missing or out of range is an
 * error naming the field; the per-layer plan (md_layer_cfg) is derived here. */
#ifndef LMSERVE_MD_CONFIG_H
#define LMSERVE_MD_CONFIG_H
#include <stddef.h>
#include <stdint.h>

#define MD_MAX_LAYERS 256
#define MD_MAX_EOS    8

enum md_arch {
  MD_ARCH_GEMMA3 = 1,
  MD_ARCH_GEMMA4 = 2,
  MD_ARCH_GEMMA4_ASSISTANT = 3,
};

enum md_layer_kind {
  MD_LAYER_SLIDING = 0,
  MD_LAYER_FULL = 1,
};

/* RoPE of one layer kind. inv_freq[i] = factor^-1 * theta^(-2i/head_dim) for
 * i < rot_pairs, 0 (identity) for rot_pairs <= i < head_dim/2. */
struct md_rope {
  double theta;
  double factor; /* linear scaling (positions / factor); 1 = none */
  int rot_pairs; /* rotated frequency pairs; head_dim/2 = full RoPE */
};

/* What one decoder layer looks like. */
struct md_layer_cfg {
  enum md_layer_kind kind;
  int head_dim;   /* elements per attention head */
  int n_kv_heads; /* key/value heads (num_global_key_value_heads on k_eq_v layers) */
  int k_eq_v;     /* 1: no v_proj, V = v_norm(raw K projection) */
  int kv_shared;  /* 1: computes Q only, reads kv_source's cache */
  int kv_source;  /* layer whose K/V this layer attends to (itself when storing);
                     -1 for an assistant layer (reads the target model's cache) */
  int ffn_dim;    /* MLP intermediate width (2x on double-wide shared layers) */
};

/* How an image becomes pixels (preprocessor_config.json, or the
 * "image_processor" object of processor_config.json; Gemma3ImageProcessor's
 * fields). Absent file or fields: resize to the vision tower's image_size,
 * rescale by 1/255, normalise with mean = std = 0.5 (the processor's defaults
 * except the size, which the tower fixes). */
#define MD_MAX_CHANNELS 4
struct md_preproc_cfg {
  int width, height;     /* resize target, px ("size": {"height", "width"}) */
  int do_resize;         /* do_resize */
  int resample;          /* PIL filter id: 2 = bilinear (the only one supported) */
  int do_rescale;        /* do_rescale */
  double rescale_factor; /* rescale_factor (1/255) */
  int do_normalize;      /* do_normalize */
  float mean[MD_MAX_CHANNELS], std[MD_MAX_CHANNELS]; /* image_mean, image_std per channel */
};

/* The SigLIP vision tower and Gemma 3 projector of a Gemma3ForConditionalGeneration
 * checkpoint (model_type "gemma3" with "vision_config"). Missing vision_config
 * fields take transformers' SiglipVisionConfig defaults; missing top-level
 * fields take Gemma3Config's. */
struct md_vision_cfg {
  int present;    /* 1: the checkpoint has a vision tower */
  int hidden;     /* vision_config.hidden_size */
  int ffn;        /* vision_config.intermediate_size */
  int n_layers;   /* vision_config.num_hidden_layers */
  int n_heads;    /* vision_config.num_attention_heads */
  int head_dim;   /* hidden / n_heads */
  int channels;   /* vision_config.num_channels */
  int image_size; /* vision_config.image_size, px */
  int patch;      /* vision_config.patch_size, px */
  double eps;     /* vision_config.layer_norm_eps (also the projector's RMSNorm) */
  int grid;       /* patches per side: image_size / patch */
  int n_patches;  /* grid^2: tokens through the encoder per image */
  int mm_tokens;  /* mm_tokens_per_image: soft tokens per image (a square) */
  int pool;       /* average-pooling kernel: grid / sqrt(mm_tokens) */
  int boi_id;     /* boi_token_index: <start_of_image> */
  int eoi_id;     /* eoi_token_index: <end_of_image> */
  int image_id;   /* image_token_index: <image_soft_token> */
  struct md_preproc_cfg pre;
};

/* Gemma 4's vision tower (Gemma4ForConditionalGeneration: model_type "gemma4"
 * with a "vision_config" of model_type "gemma4_vision"), after transformers'
 * Gemma4VisionConfig (configuration_gemma4.py): missing fields take its
 * defaults, a bad one is an error naming it. The tower and embedder are
 * worker/wk-vision-g4.h; the prompt wiring is later work (model/README.md). Kept
 * apart from md_vision_cfg so that nothing built for Gemma 3's SigLIP tower
 * takes it for one. */
struct md_vision_g4_cfg {
  int present;         /* 1: the checkpoint has a Gemma 4 vision tower */
  int hidden;          /* vision_config.hidden_size */
  int ffn;             /* vision_config.intermediate_size (gated MLP width) */
  int n_layers;        /* vision_config.num_hidden_layers */
  int n_heads;         /* vision_config.num_attention_heads */
  int n_kv_heads;      /* vision_config.num_key_value_heads */
  int head_dim;        /* vision_config.head_dim: elements per head, a multiple of 4
                          (2D RoPE: half by x, half by y, each rotate-half) */
  int patch;           /* vision_config.patch_size, px (16) */
  int pool;            /* vision_config.pooling_kernel_size: patches per pooled side (3) */
  int pos_size;        /* vision_config.position_embedding_size: rows of each of the
                          x and y position tables (10240) */
  int default_tokens;  /* vision_config.default_output_length: soft tokens per image
                          when a request names none (280), one of 70/140/280/560/1120 */
  int max_pos;         /* vision_config.max_position_embeddings */
  double eps;          /* vision_config.rms_norm_eps */
  double rope_theta;   /* vision_config.rope_parameters.rope_theta (100) */
  int clipped_linears; /* vision_config.use_clipped_linears: input_min/max,
                          output_min/max buffers around each linear */
  int standardize;     /* vision_config.standardize: std_bias / std_scale on the
                          pooled tokens */
  int attention_bias;  /* vision_config.attention_bias (must be false) */
  int bidir;           /* text_config.use_bidirectional_attention: 0 null, 1 "vision"
                          (an image's tokens see each other), 2 "all" */
  int boi_id;          /* boi_token_id: <|image> */
  int eoi_id;          /* eoi_token_id: <image|> */
  int image_id;        /* image_token_id: <|image|> (a soft token) */
};

/* Gemma 4's audio tower (Gemma4ForConditionalGeneration: model_type "gemma4"
 * with an "audio_config" of model_type "gemma4_audio"), after transformers'
 * Gemma4AudioConfig (configuration_gemma4.py): missing fields take its
 * defaults, a bad one is an error naming it. The tower and embedder are
 * worker/wk-audio-g4.h; the features it takes, model/md-audio-g4.h. */
struct md_audio_g4_cfg {
  int present;            /* 1: the checkpoint has a Gemma 4 audio tower */
  int hidden;             /* audio_config.hidden_size (1024) */
  int n_layers;           /* audio_config.num_hidden_layers (12) */
  int n_heads;            /* audio_config.num_attention_heads (8); hidden / n_heads per head */
  int conv_ch[2];         /* audio_config.subsampling_conv_channels ([128, 32]) */
  int conv_kernel;        /* audio_config.conv_kernel_size: the light conv's depthwise taps (5) */
  int chunk;              /* audio_config.attention_chunk_size: queries per block (12) */
  int ctx_left;           /* audio_config.attention_context_left (13; the frame itself counts) */
  int ctx_right;          /* audio_config.attention_context_right (0) */
  int output_dims;        /* audio_config.output_proj_dims (1536) */
  int clipped_linears;    /* audio_config.use_clipped_linears (true) */
  double residual_weight; /* audio_config.residual_weight: the macaron halves (0.5) */
  double logit_cap;       /* audio_config.attention_logit_cap (50) */
  double invalid_logit;   /* audio_config.attention_invalid_logits_value (-1e9) */
  double eps;             /* audio_config.rms_norm_eps (1e-6) */
  double grad_clip;       /* audio_config.gradient_clipping: the clamp around each residual
                             step (1e10) */
  int audio_id;           /* audio_token_id: <|audio|> (a soft token) */
  int boa_id;             /* boa_token_id: <|audio> */
  int eoa_id;             /* eoa_token_index (or eoa_token_id): <audio|> */
};

struct md_config {
  enum md_arch arch;
  char model_type[32];
  int vocab;  /* tokens */
  int hidden; /* residual width */
  int ffn;    /* intermediate_size */
  int n_layers;
  int n_heads;            /* query heads */
  int n_kv_heads;         /* num_key_value_heads */
  int head_dim;           /* sliding (and Gemma 3) head dim */
  int global_head_dim;    /* full-layer head dim (Gemma 4), else head_dim */
  int n_global_kv_heads;  /* for attention_k_eq_v full layers; 0 = n_kv_heads */
  int sliding_window;     /* tokens a sliding query sees (itself included) */
  int max_pos;            /* max_position_embeddings */
  double eps;             /* rms_norm_eps */
  double attn_scale;      /* query_pre_attn_scalar^-0.5 (Gemma 3) or 1.0 (Gemma 4) */
  double attn_softcap;    /* 0 = none */
  double final_softcap;   /* 0 = none */
  struct md_rope rope[2]; /* by enum md_layer_kind */
  int k_eq_v;             /* attention_k_eq_v */
  int n_kv_shared;        /* num_kv_shared_layers */
  int double_wide_mlp;
  int ple_dim;   /* hidden_size_per_layer_input; 0 = no PLE */
  int ple_vocab; /* vocab_size_per_layer_input */
  int moe;       /* enable_moe_block */
  int n_experts, top_k_experts, moe_ffn;
  int tie_embeddings;
  int fp8; /* quantization_config: linear weights stored as FP8 e4m3 with per-channel or
              per-tensor scales (compressed-tensors, or quant_method "fp8" without blocks) */
  int kv_scales; /* quantization_config.kv_cache_scheme (compressed-tensors: 8-bit float,
                    static, symmetric, per tensor or per attention head): every layer that
                    stores K/V has self_attn.k_scale and v_scale for an fp8 KV cache */
  int gguf; /* read from a GGUF file: llama.cpp's conventions (Gemma 3's norm weights
               stored as 1 + w) */
  int bos_id, pad_id;
  int eos_ids[MD_MAX_EOS];
  int n_eos;
  /* gemma4_assistant only */
  int backbone_hidden;
  int use_ordered_embeddings;
  int num_centroids;
  int centroid_top_k;
  struct md_layer_cfg layers[MD_MAX_LAYERS];
  struct md_vision_cfg vision;       /* gemma3 with vision_config; present == 0 otherwise */
  struct md_vision_g4_cfg vision_g4; /* gemma4 with vision_config; present == 0 otherwise */
  struct md_audio_g4_cfg audio_g4;   /* gemma4 with audio_config; present == 0 otherwise */
};

/* Parses config.json text (`len` bytes). On error returns a negative cm_err
 * and writes a one-line reason to err ("config.json: hidden_size missing"). */
int md_config_parse(const char *text, size_t len, struct md_config *cfg, char *err, size_t errlen);

/* Reads DIR/config.json and, when present, DIR/generation_config.json (its
 * eos_token_id list replaces the config's) and, for a checkpoint with a
 * vision tower (Gemma 3's or Gemma 4's), DIR/preprocessor_config.json or
 * DIR/processor_config.json. */
int md_config_load(const char *dir, struct md_config *cfg, char *err, size_t errlen);

/* GGUF checkpoints (md-config-gguf.c). md_model_gguf_path: 1 and the file's path
 * in path[n] when model is a .gguf file or a folder with one .gguf and no
 * config.json; 0 for anything else (a Hugging Face checkpoint folder); a
 * negative cm_err with a sentence for a file that is not GGUF or a folder
 * with several. md_config_from_gguf: the config of an open file's metadata
 * (general.architecture gemma3 or gemma4), the text model's alone. */
struct md_gguf;
int md_model_gguf_path(const char *model, char *path, size_t n, char *err, size_t errlen);
int md_config_from_gguf(const struct md_gguf *g, struct md_config *cfg, char *err, size_t errlen);
int md_config_load_gguf(const char *model, const char *path, struct md_config *cfg, char *err,
                        size_t errlen);

/* A Gemma 3 vision tower in llama.cpp's mmproj layout (a GGUF file of
 * general.architecture "clip", clip.projector_type "gemma3"), or Gemma 4's
 * vision and audio towers (clip.vision.projector_type "gemma4v",
 * clip.audio.projector_type "gemma4a"), named by --mmproj or beside the model
 * file in a model folder.
 * md_model_mmproj_path: 1 and its path when --mmproj named one
 * (md_model_set_mmproj) or model is a folder holding one, 0 when there is
 * none (a model file named alone), a negative cm_err with a sentence for
 * several. md_config_add_mmproj: its towers, preprocessing and image (and
 * audio) tokens (from the text file's vocabulary) into the text config cfg.
 * md_config_from_gguf_model: the config of model's open GGUF file g (model:
 * the folder or file the user named) with the tower found for model (none,
 * or one found in the folder that cannot be read: a warning, and the model
 * serves text); md_config_load_gguf opens path for it. */
int md_model_mmproj_path(const char *model, char *path, size_t n, char *err, size_t errlen);
/* The vision tower file named on a role's command line (--mmproj, as
 * llama.cpp's server names it): every GGUF model this process then opens
 * takes it, wherever it lies (NULL or "": the folder's own again). 0, or a
 * negative cm_err with a sentence for a file that is not one. */
int md_model_set_mmproj(const char *path, char *err, size_t errlen);
/* A role's --mmproj (NULL: none) for its --model: md_model_set_mmproj, once
 * the model is known to be a GGUF one. */
int md_model_mmproj_arg(const char *model, const char *mmproj, char *err, size_t errlen);
/* --model's help where a role loads the checkpoint, the same in every role */
#define MD_MODEL_HELP                                                                              \
  "the checkpoint: a Hugging Face folder (config.json, safetensors), a GGUF file, or a folder "    \
  "holding one .gguf (a GGUF model's tokenizer and chat template come from its metadata)"
/* --mmproj's help, the same in every role */
#define MD_MMPROJ_HELP                                                                             \
  "a GGUF model's towers (Gemma 3's vision, Gemma 4's vision and audio): llama.cpp's mmproj "      \
  "file (default: the one in --model's folder when --model names the folder; a file named "        \
  "alone serves text)"
int md_config_add_mmproj(const struct md_gguf *mm, const struct md_gguf *text,
                         struct md_config *cfg, char *err, size_t errlen);
/* An mmproj file's projector for one modality ("vision", "audio") into
 * buf[n], as clip.cpp reads it: clip.projector_type, else
 * clip.<modality>.projector_type; "" when neither is set. */
void md_mmproj_projector(const struct md_gguf *mm, const char *modality, char *buf, size_t n);
int md_config_from_gguf_model(const char *model, const struct md_gguf *g, struct md_config *cfg,
                              char *err, size_t errlen);

/* config.json's "vision_config" and Gemma 3's image fields (mm_tokens_per_image,
 * boi/eoi/image_token_index) of JSON text into cfg->vision, for a text config
 * already in cfg, with the checks config.json's get. For a Gemma 4 text
 * config: Gemma 4's "vision_config" (with text_config's
 * use_bidirectional_attention) and "audio_config" and their token ids into
 * cfg->vision_g4 and cfg->audio_g4, either of them absent. */
int md_config_parse_vision(const char *text, size_t len, struct md_config *cfg, char *err,
                           size_t errlen);

/* Parses preprocessor_config.json text (or, with nested != 0, the
 * "image_processor" object of processor_config.json) into cfg->vision.pre,
 * over the defaults md_config_parse set; checks that the resize target is
 * the tower's image_size (the encoder takes no other). */
int md_config_parse_preproc(const char *text, size_t len, int nested, struct md_config *cfg,
                            char *err, size_t errlen);

/* The same for a Gemma 4 tower (Gemma4ImageProcessor's fields): max_soft_tokens
 * (one of the allowed budgets) replaces vision_g4.default_tokens; patch_size and
 * pooling_kernel_size must be the tower's; resample 3 (bicubic), do_resize,
 * do_rescale with rescale_factor 1/255 and no do_normalize are the only
 * preprocessing accepted (the processor's defaults); other fields are ignored. */
int md_config_parse_preproc_g4(const char *text, size_t len, int nested, struct md_config *cfg,
                               char *err, size_t errlen);

/* Adds eos ids from generation_config.json text (replacing the list). */
int md_config_parse_generation(const char *text, size_t len, struct md_config *cfg, char *err,
                               size_t errlen);

/* Sampling defaults a checkpoint's creator recommends (generation_config.json), as
 * vLLM's --generation-config auto applies them to requests that leave a field out.
 * As vLLM reads them (transformers' GenerationConfig.to_diff_dict), a value equal
 * to transformers' own default says nothing: temperature 1, top_k 50, top_p 1,
 * repetition_penalty 1. max_new_tokens caps every request's max_tokens. */
enum {
  MD_SAMPLE_TEMPERATURE = 1u << 0,
  MD_SAMPLE_TOP_P = 1u << 1,
  MD_SAMPLE_TOP_K = 1u << 2,
  MD_SAMPLE_MIN_P = 1u << 3,
  MD_SAMPLE_REPETITION_PENALTY = 1u << 4,
  MD_SAMPLE_MAX_TOKENS = 1u << 5,
};

struct md_sampling {
  unsigned has; /* MD_SAMPLE_* */
  double temperature, top_p, min_p, repetition_penalty;
  int32_t top_k;
  int64_t max_tokens;
};

/* Adds the sampling defaults of a generation_config.json text (or of an
 * --override-generation-config object: every field it names counts, a default
 * value too) over *s; `what` names the text in errors. A value outside the API's
 * range (temperature [0, 2], top_p (0, 1], top_k -1 or >= 1, min_p [0, 1],
 * repetition_penalty (0, 2], max_new_tokens >= 1) is an error naming it. */
int md_sampling_parse(const char *text, size_t len, int override, const char *what,
                      struct md_sampling *s, char *err, size_t errlen);

/* --generation-config: "vllm" (none), "auto" (dir's generation_config.json, when dir is
 * a folder that has one) or a folder's; then the override's JSON object (NULL: none). */
int md_sampling_load(const char *mode, const char *dir, const char *override, struct md_sampling *s,
                     char *err, size_t errlen);

/* Index of the last non-shared layer of `kind` before the first KV-shared
 * layer, or -1. */
int md_config_last_storing_layer(const struct md_config *cfg, enum md_layer_kind kind);

const char *md_arch_name(enum md_arch arch);

/* 1 when n is a soft-token budget Gemma 4's image processor accepts (70, 140,
 * 280, 560, 1120), else 0. */
int md_g4_soft_tokens_allowed(int n);

/* Whether the tokens of one image attend to each other (bidirectionally, in
 * prefill) in the layers of this kind; the one switch for every role and
 * test. Gemma 3 (and any model without Gemma 4's vision tower): every layer
 * (transformers' Gemma3 adds the image mask to the sliding and the full
 * mask). Gemma 4: none unless the text config says
 * use_bidirectional_attention "vision" (or "all"); then the sliding layers
 * only, as transformers' modeling_gemma4.py at c308a30 (the version our
 * references follow) and vLLM do, not the full ones (newer transformers
 * code adds it to both: MD_G4_IMAGE_BIDIR_FULL in md-config.c). */
int md_image_bidir(const struct md_config *cfg, enum md_layer_kind kind);

/* Reads a whole small file into a malloc'd NUL-terminated buffer (cap bytes
 * at most). Returns 0, CM_ERR_NOENT, CM_ERR_IO or CM_ERR_TOOBIG. */
int md_read_file(const char *path, size_t cap, char **out, size_t *len);

#endif
