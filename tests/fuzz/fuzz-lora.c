/* fuzz-lora.c — fuzz target for LoRA adapters (model/md-lora.c), an untrusted folder
 * a server is started with.
 *
 * Input: byte 0's low bit picks the model the adapter is checked against (0: a tiny
 * Gemma 3, 1: a tiny Gemma 4 with k_eq_v and KV-shared layers), its next bit the kind
 * of adapter:
 *   0, a PEFT folder: bytes 1-2 (little-endian) are the length of adapter_config.json's
 *      text, which follows; the rest is adapter_model.safetensors;
 *   1, llama.cpp's GGUF adapter file (md-lora-gguf.c): the rest.
 * They are written to a folder of this process and opened with md_lora_open. It must return 0 or a negative cm_err with a message; an adapter
 * that opens must have every module's A [r, in] and B [out, r] in the model's widths,
 * readable whole with md_lora_read_f32. Any other outcome aborts (a finding). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "model/md-lora.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char g3[] =
    "{\"model_type\":\"gemma3_text\",\"vocab_size\":512,\"hidden_size\":64,"
    "\"intermediate_size\":128,\"num_hidden_layers\":6,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"head_dim\":32,\"sliding_window\":64,\"sliding_window_pattern\":3,"
    "\"max_position_embeddings\":8192,\"rms_norm_eps\":1e-6,\"query_pre_attn_scalar\":32,"
    "\"eos_token_id\":[1,106],\"bos_token_id\":2,\"pad_token_id\":0,"
    "\"architectures\":[\"Gemma3ForCausalLM\"]}";
static const char g4[] =
    "{\"model_type\":\"gemma4_text\",\"vocab_size\":512,\"hidden_size\":64,"
    "\"intermediate_size\":128,\"num_hidden_layers\":6,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"head_dim\":32,\"sliding_window\":64,\"layer_types\":["
    "\"sliding_attention\",\"sliding_attention\",\"full_attention\",\"sliding_attention\","
    "\"sliding_attention\",\"full_attention\"],\"max_position_embeddings\":8192,"
    "\"rms_norm_eps\":1e-6,\"eos_token_id\":[1,106],\"bos_token_id\":2,\"pad_token_id\":0,"
    "\"global_head_dim\":64,\"num_global_key_value_heads\":1,\"attention_k_eq_v\":true,"
    "\"num_kv_shared_layers\":2,\"use_double_wide_mlp\":true,\"hidden_size_per_layer_input\":8,"
    "\"vocab_size_per_layer_input\":512,\"architectures\":[\"Gemma4ForCausalLM\"]}";

static struct md_config *cfgs[2];
static char dir[256];

static int write_file(const char *name, const uint8_t *p, size_t n) {
  char path[300];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(p, 1, n, f) == n;
  return fclose(f) == 0 && ok ? 0 : -1;
}

static void once(void) {
  char err[256];
  for (int i = 0; i < 2; i++) {
    cfgs[i] = calloc(1, sizeof(*cfgs[i]));
    const char *t = i ? g4 : g3;
    if (!cfgs[i] || md_config_parse(t, strlen(t), cfgs[i], err, sizeof(err))) abort();
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof(dir), "%s/fuzz-lora-%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
  (void)mkdir(dir, 0700);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  if (!cfgs[0]) once();
  const struct md_config *cfg = cfgs[data[0] & 1];
  char path[300];
  if (data[0] & 2) {
    snprintf(path, sizeof(path), "%s/adapter.gguf", dir);
    if (write_file("adapter.gguf", data + 1, size - 1)) return 0;
  } else {
    snprintf(path, sizeof(path), "%s", dir);
    size_t clen = (size_t)data[1] | (size_t)data[2] << 8;
    if (clen > size - 3) clen = size - 3;
    if (write_file("adapter_config.json", data + 3, clen) ||
        write_file("adapter_model.safetensors", data + 3 + clen, size - 3 - clen))
      return 0;
  }
  struct md_lora *l = NULL;
  char err[512] = "";
  int rc = md_lora_open(path, cfg, &l, err, sizeof(err));
  if (rc > 0 || (rc < 0 && (rc <= CM_ERR__LAST || !err[0]))) abort();
  if (rc) return 0;
  if (l->rank < 1 || l->rank > MD_LORA_MAX_RANK || l->n_layers != cfg->n_layers) abort();
  float *buf = NULL;
  for (int layer = 0; layer < l->n_layers; layer++)
    for (int m = 0; m < MD_LORA_N_MODS; m++) {
      const struct md_lora_mod_w *w = &l->mods[layer][m];
      if (!w->a != !w->b) abort();
      if (!w->a) continue;
      int in, out;
      if (md_lora_dims(cfg, layer, (enum md_lora_mod)m, &in, &out)) abort();
      if (w->a->shape[0] != l->rank || w->a->shape[1] != in || w->b->shape[0] != out ||
          w->b->shape[1] != l->rank)
        abort();
      size_t most = (size_t)l->rank * (size_t)(in > out ? in : out);
      float *nb = realloc(buf, sizeof(float) * most);
      if (!nb) break;
      buf = nb;
      if (md_lora_read_f32(w->a, 0, l->rank, 0, in, 1.0f, buf) ||
          md_lora_read_f32(w->b, 0, out, 0, l->rank, 0.5f, buf))
        abort();
    }
  free(buf);
  md_lora_close(l);
  return 0;
}
