/* tl-make-tiny-model.c — the `lmserve make-tiny-model` subcommand (not implemented yet). */
#include "tools/tl-main.h"

#include <stdio.h>

int tl_make_tiny_model_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve make-tiny-model: not implemented yet\n");
  return 2;
}
