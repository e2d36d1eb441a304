/* wk-main.c — the `lmserve worker` subcommand (not implemented yet). */
#include "worker/wk-main.h"

#include <stdio.h>

int wk_worker_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve worker: not implemented yet\n");
  return 2;
}
