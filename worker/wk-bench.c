/* wk-bench.c — the `lmserve bench model` subcommand (not implemented yet). */
#include "worker/wk-main.h"

#include <stdio.h>

int wk_bench_model_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve bench model: not implemented yet\n");
  return 2;
}
