/* th-llamacpp.c — see th-llamacpp.h. The quantizer runs in a child process,
 * which opens libllama with dlopen (its RUNPATH finds libggml beside it) and
 * leaves with _exit: the test process never maps llama.cpp, and a sanitizer's
 * leak check never looks at llama.cpp's allocations. The parameter block
 * mirrors llama_model_quantize_params of the llama.cpp release the npm package
 * pins (tools/llamacpp/package-lock.json), laid out as that release's
 * include/llama.h declares it. */
#include "tests/harness/th-llamacpp.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

void th_llamacpp_prompts(char prompts[3][1024], char *all) {
  snprintf(prompts[0], 1024, "[2,651,1234,99,5000]");
  snprintf(prompts[1], 1024, "[2,7000,7001,7002,8000,123,4567,10,11,12]");
  int len = snprintf(prompts[2], 1024, "[2");
  for (int i = 1; i < 100; i++)
    len +=
        snprintf(prompts[2] + len, 1024 - (size_t)len, ",%d", (int)((i * 7919u + 17u) % 262000u));
  snprintf(prompts[2] + len, 1024 - (size_t)len, "]");
  snprintf(all, 4096, "[%s,%s,%s]", prompts[0], prompts[1], prompts[2]);
}

struct quantize_params {
  int32_t nthread;
  int ftype;                /* enum llama_ftype */
  int output_tensor_type;   /* enum ggml_type */
  int token_embedding_type; /* enum ggml_type */
  bool allow_requantize, quantize_output_tensor, only_copy, pure, keep_split, dry_run;
  const void *imatrix, *kv_overrides, *tt_overrides;
  const int32_t *prune_layers;
  size_t max_buf_size;
};

typedef struct quantize_params (*default_params_fn)(void);
typedef uint32_t (*quantize_fn)(const char *in, const char *out, const struct quantize_params *p);

static char path[1200], why[1400];

const char *th_llamacpp_lib(void) {
  if (*path) return NULL;
  if (*why) return why;
  const char *src = getenv("TH_SOURCE_DIR");
  char pat[1100];
  snprintf(pat, sizeof(pat),
           "%s/tools/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama*.so",
           src ? src : ".");
  glob_t g = {0};
  if (glob(pat, 0, NULL, &g) || g.gl_pathc < 1)
    snprintf(why, sizeof(why), "no libllama under tools/llamacpp (run tools/setup): %s", pat);
  else
    snprintf(path, sizeof(path), "%s", g.gl_pathv[0]);
  globfree(&g);
  return *path ? NULL : why;
}

/* The child: 0 quantized, 2 libllama did not open, 3 the quantizer failed. */
static int child(const char *in, const char *out, int ftype) {
  int null = open("/dev/null", O_WRONLY);
  if (null >= 0) dup2(null, 1), dup2(null, 2); /* llama.cpp logs every tensor */
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  default_params_fn defaults =
      lib ? (default_params_fn)dlsym(lib, "llama_model_quantize_default_params") : NULL;
  quantize_fn quantize = lib ? (quantize_fn)dlsym(lib, "llama_model_quantize") : NULL;
  if (!defaults || !quantize) return 2;
  struct quantize_params p = defaults();
  p.ftype = ftype;
  p.nthread = 2;
  return quantize(in, out, &p) ? 3 : 0;
}

int th_llamacpp_quantize(const char *in, const char *out, int ftype, char *err, size_t errlen) {
  const char *no = th_llamacpp_lib();
  if (no) {
    snprintf(err, errlen, "%s", no);
    return 1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(err, errlen, "fork failed");
    return 1;
  }
  if (pid == 0) _exit(child(in, out, ftype));
  int st = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    snprintf(err, errlen, "llama_model_quantize %s -> %s (ftype %d): %s", in, out, ftype,
             code == 2   ? "libllama or its quantizer did not load"
             : code == 3 ? "the quantizer failed"
                         : "the child died");
    return 1;
  }
  return 0;
}
