/* tl-serve.c — the `lmserve serve` subcommand (not implemented yet). */
#include "tools/tl-main.h"

#include <stdio.h>

int tl_serve_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve serve: not implemented yet\n");
  return 2;
}
