/* fuzz-gguf.c — fuzz target for model/'s GGUF reader and what reads its
 * metadata. The reader must return 0 or a negative cm_err with a message;
 * what it yields must lie inside the input: every metadata value's bytes,
 * every string of an array, every known tensor's bytes. An open file then
 * goes to the model description (md_config_from_gguf) and the tokenizer
 * (tk_from_gguf, with its chat template), which must also end in 0 or a
 * negative cm_err with a message; a tokenizer made from the file encodes
 * and decodes a short text. Any other outcome aborts (a finding). The seeds
 * gemma3.gguf and gemma4.gguf are small but whole: the metadata of both
 * architectures, a vocabulary (SentencePiece scores; Gemma 4's merges) and
 * a token_embd.weight, so the fuzzer starts where those readers go deep;
 * mmproj.gguf is a whole vision tower as llama.cpp's mmproj file holds it,
 * mmproj-g4.gguf Gemma 4's vision and audio towers (the position table and
 * two audio matrices cut short: the towers' config reads only their
 * shapes). Each input is also read as a tower beside a Gemma 3 and a Gemma 4
 * text config. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "model/md-config.h"
#include "model/md-gguf.h"
#include "tokenizer/tk-tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* rc is 0, or a negative cm_err with a message in err. */
static void clean_end(int rc, const char *err) {
  if (rc > 0 || (rc < 0 && (rc <= CM_ERR__LAST || !err[0]))) abort();
}

/* A small Gemma 3 text config, for reading g as its vision tower. */
static const char text_cfg[] = "{\"model_type\":\"gemma3_text\",\"vocab_size\":262208,"
                               "\"hidden_size\":64,\"intermediate_size\":128,"
                               "\"num_hidden_layers\":2,\"num_attention_heads\":2,"
                               "\"num_key_value_heads\":1,\"head_dim\":32}";

/* And a small Gemma 4 one, with per-layer inputs. */
static const char text_cfg_g4[] = "{\"model_type\":\"gemma4_text\",\"vocab_size\":262144,"
                                  "\"hidden_size\":64,\"intermediate_size\":128,"
                                  "\"num_hidden_layers\":2,\"num_attention_heads\":2,"
                                  "\"num_key_value_heads\":1,\"head_dim\":32,"
                                  "\"hidden_size_per_layer_input\":8}";

/* The model description and the tokenizer of open file g; and g read as
 * an mmproj file's towers (md_config_add_mmproj) beside a text config, g's
 * own when it has one, and beside the Gemma 4 one. */
static void readers(const struct md_gguf *g) {
  struct md_config cfg;
  char err[256] = "";
  int crc = md_config_from_gguf(g, &cfg, err, sizeof(err));
  clean_end(crc, err);
  if (crc && md_config_parse(text_cfg, sizeof(text_cfg) - 1, &cfg, err, sizeof(err))) abort();
  err[0] = 0;
  clean_end(md_config_add_mmproj(g, g, &cfg, err, sizeof(err)), err);
  if (md_config_parse(text_cfg_g4, sizeof(text_cfg_g4) - 1, &cfg, err, sizeof(err))) abort();
  err[0] = 0;
  clean_end(md_config_add_mmproj(g, g, &cfg, err, sizeof(err)), err);
  struct tk_tokenizer *tok = NULL;
  char *tmpl = NULL;
  err[0] = 0;
  int rc = tk_from_gguf(g, "fuzz.gguf", &tok, &tmpl, err, sizeof(err));
  clean_end(rc, err);
  if (rc) {
    if (tok || tmpl) abort();
    return;
  }
  static const char text_in[] = "abc \n<bos>user";
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  if (tk_encode(tok, NULL, text_in, sizeof(text_in) - 1, TK_DEFAULT, &ids, &n, &cap) == 0) {
    char *text = NULL;
    size_t len = 0, tcap = 0;
    /* NUL-terminated; a vocabulary's token may hold a NUL itself (a byte
     * token as bos, say), so the length is the call's, not strlen's */
    if (tk_decode(tok, ids, n, 0, &text, &len, &tcap) == 0 && (len >= tcap || text[len])) abort();
    free(text);
  }
  free(ids);
  free(tmpl);
  tk_free(tok);
}

static void inside(const uint8_t *base, size_t size, const void *p, uint64_t n) {
  const uint8_t *q = p;
  if (q < base || q > base + size || n > (uint64_t)(base + size - q)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct md_gguf *g = NULL;
  char err[256] = "";
  int rc = md_gguf_open_mem(data, size, "fuzz.gguf", &g, err, sizeof(err));
  clean_end(rc, err);
  if (rc) return 0;
  for (int i = 0; i < md_gguf_kv_count(g); i++) {
    const struct md_gguf_kv *kv = md_gguf_kv_at(g, i);
    inside(data, size, kv->val, kv->bytes);
    if (md_gguf_find_kv(g, kv->key) != kv) abort();
    if (kv->type == MD_GGUF_ARRAY && kv->arr_type == MD_GGUF_STRING) {
      uint64_t pos = 0, n = 0;
      const char *s;
      size_t len;
      while (md_gguf_arr_next_str(kv, &pos, &s, &len) == 0) {
        inside(data, size, s, len);
        n++;
      }
      if (n != kv->n) abort();
    }
  }
  for (int i = 0; i < md_gguf_tensor_count(g); i++) {
    const struct md_gguf_tensor *t = md_gguf_tensor_at(g, i);
    if (t->nbytes) inside(data, size, t->data, t->nbytes);
    if (md_gguf_find_tensor(g, t->name) != t) abort();
  }
  readers(g);
  md_gguf_close(g);
  return 0;
}
