/* tl-bench.c — the `lmserve bench` subcommand (not implemented yet). */
#include "tools/tl-main.h"

#include <stdio.h>

int tl_bench_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve bench: not implemented yet\n");
  return 2;
}
