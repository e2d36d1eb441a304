/* tl-bench.c — `lmserve bench <what>`: dispatches to the benchmark of each part. */
#include <stdio.h>
#include <string.h>

#include "common/cm-assert.h"
#include "tools/tl-main.h"

static const struct {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *help;
} benches[] = {
    {"model", tl_bench_model_main, "prefill and decode tokens/s of one model, memory bandwidth"},
    {"tokenizer", tl_bench_tokenizer_main, "tokenizer load time and encode throughput"},
    {"serve", tl_bench_serve_main,
     "load generator against a running server (like vllm bench serve)"},
    {"coll", tl_bench_coll_main, "all-reduce latency of CPU tensor-parallel ranks (shared memory)"},
    {"soak", tl_bench_soak_main, "long run with aborts, malformed requests and worker kills"},
    {"vision", tl_bench_vision_main, "image encoder images/s and time to first token of one image"},
    {"grammar", tl_bench_grammar_main,
     "structured outputs: compile and token-mask times over a corpus"},
    {"matmul", tl_bench_matmul_main, "rate of one matmul kernel: a weight format, a shape"},
};

int tl_bench_main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    FILE *f = argc < 2 ? stderr : stdout;
    fprintf(f, "usage: lmserve bench <what> [options]\n\n");
    for (size_t i = 0; i < CM_ARRAY_LEN(benches); i++)
      fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].help);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < CM_ARRAY_LEN(benches); i++)
    if (!strcmp(argv[1], benches[i].name)) return benches[i].fn(argc - 1, argv + 1);
  fprintf(stderr,
          "lmserve bench: unknown benchmark '%s' (model, tokenizer, serve, coll, soak, vision, "
          "grammar, matmul)\n",
          argv[1]);
  return 2;
}
