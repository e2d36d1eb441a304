/* fe-tok-bench.c — the `lmserve bench tokenizer` subcommand (not implemented yet). */
#include "frontend/fe-main.h"

#include <stdio.h>

int fe_bench_tokenizer_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve bench tokenizer: not implemented yet\n");
  return 2;
}
