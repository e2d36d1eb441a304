/* fe-tokenize-cli.c — the `lmserve tokenize` subcommand (not implemented yet). */
#include "frontend/fe-main.h"

#include <stdio.h>

int fe_tokenize_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve tokenize: not implemented yet\n");
  return 2;
}

int fe_detokenize_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve detokenize: not implemented yet\n");
  return 2;
}
