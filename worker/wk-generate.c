/* wk-generate.c — the `lmserve generate` subcommand (not implemented yet). */
#include "worker/wk-main.h"

#include <stdio.h>

int wk_generate_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve generate: not implemented yet\n");
  return 2;
}
