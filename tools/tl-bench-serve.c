/* tl-bench-serve.c — the `lmserve bench serve` subcommand (not implemented yet). */
#include "tools/tl-main.h"

#include <stdio.h>

int tl_bench_serve_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve bench serve: not implemented yet\n");
  return 2;
}
