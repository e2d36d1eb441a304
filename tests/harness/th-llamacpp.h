/* th-llamacpp.h — llama.cpp's own quantizer (llama_model_quantize in the npm
 * package node-llama-cpp's prebuilt libllama, tools/llamacpp/), for tests that
 * check lmserve against files llama.cpp writes. */
#ifndef LMSERVE_TH_LLAMACPP_H
#define LMSERVE_TH_LLAMACPP_H

#include <stddef.h>

/* llama.cpp's llama_ftype numbers (include/llama.h) of the types the tests ask. */
enum {
  TH_LLAMA_FTYPE_Q4_0 = 2,
  TH_LLAMA_FTYPE_Q8_0 = 7,
  TH_LLAMA_FTYPE_Q2_K = 10,
  TH_LLAMA_FTYPE_Q3_K_M = 12,
  TH_LLAMA_FTYPE_Q4_K_M = 15,
  TH_LLAMA_FTYPE_Q6_K = 18,
  TH_LLAMA_FTYPE_IQ4_NL = 25,
  TH_LLAMA_FTYPE_IQ4_XS = 30,
};

/* NULL when libllama can be loaded from tools/llamacpp (TH_SOURCE_DIR), else a
 * sentence saying why not (a test skips with it). */
const char *th_llamacpp_lib(void);

/* Quantizes GGUF file `in` (f32 or 16-bit) to `out` as `llama-quantize in out
 * FTYPE` does, 2 threads, no importance matrix. 0, or nonzero with a sentence
 * in err. */
int th_llamacpp_quantize(const char *in, const char *out, int ftype, char *err, size_t errlen);

/* The llama.cpp comparisons' three prompts (token ids; the first is <bos>): short,
 * short, and 100 tokens (past the tiny models' 64-token window), as JSON arrays, and
 * all[4096] the three in one array. */
void th_llamacpp_prompts(char prompts[3][1024], char *all);

#endif
