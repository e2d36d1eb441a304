/* lmserve.c — the `lmserve` binary: dispatches to one subcommand per role. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/cm-assert.h"
#include "common/cm-log.h"
#include "frontend/fe-main.h"
#include "kernels/cpu/kn-cpu.h"
#include "lmserve-config.h"
#include "scheduler/sch-main.h"
#include "tools/tl-main.h"
#include "worker/wk-main.h"

struct subcommand {
  const char *name;
  int (*fn)(int argc, char **argv); /* argv[0] is the subcommand name */
  const char *help;
};

static const struct subcommand subcommands[] = {
    {"serve", tl_serve_main, "start frontend, scheduler and workers and serve the OpenAI API"},
    {"frontend", fe_frontend_main, "run the HTTP frontend role alone"},
    {"scheduler", sch_main, "run the scheduler role alone"},
    {"worker", wk_worker_main, "run one worker (tensor-parallel rank) alone"},
    {"generate", tl_generate_main, "offline generation in one process (tests, demos)"},
    {"run-batch", tl_run_batch_main,
     "a file of requests in OpenAI's batch format through serve (vLLM's run-batch)"},
    {"tokenize", tl_tokenize_main, "text on stdin -> token ids (JSON array)"},
    {"detokenize", tl_detokenize_main, "token ids (JSON array) on stdin -> text"},
    {"bench", tl_bench_main, "benchmarks: bench model | bench serve"},
    {"make-tiny-model", tl_make_tiny_model_main, "write a small random-weight checkpoint"},
    {"export-gguf", tl_export_gguf_main,
     "write a Gemma 3 / Gemma 4 checkpoint as GGUF for llama.cpp"},
    {"quantize", tl_quantize_main,
     "write a Gemma 3 / 4 checkpoint as a Q8_0 / Q4_0 / ... GGUF file"},
};

static void usage(FILE *f) {
  fprintf(f,
          "lmserve %s — an inference server for Gemma 3 and Gemma 4\n\n"
          "usage: lmserve <command> [options]\n"
          "       lmserve <command> --help\n\ncommands:\n",
          LMSERVE_VERSION);
  for (size_t i = 0; i < CM_ARRAY_LEN(subcommands); i++)
    fprintf(f, "  %-16s %s\n", subcommands[i].name, subcommands[i].help);
  fprintf(f, "\n  --version        print the version, build features and CPU kernel set\n");
}

int main(int argc, char **argv) {
  cm_log_init_from_env();
  signal(SIGPIPE, SIG_IGN); /* sockets report EPIPE instead */
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    /* cpu: the best kernel table this processor has under LMSERVE_KERNELS's cap */
    printf("lmserve %s (cpu: %s, cuda: %s, nccl: %s)\n", LMSERVE_VERSION,
           kn_cpu_isa_name(kn_cpu_isa_detect()), LMSERVE_HAVE_CUDA ? "yes" : "no",
           LMSERVE_HAVE_NCCL ? "yes" : "no");
    return 0;
  }
  for (size_t i = 0; i < CM_ARRAY_LEN(subcommands); i++)
    if (!strcmp(cmd, subcommands[i].name)) return subcommands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "lmserve: unknown command '%s' (see lmserve --help)\n", cmd);
  return 2;
}
