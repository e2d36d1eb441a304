/* fe-main.c — the `lmserve frontend` subcommand (not implemented yet). */
#include "frontend/fe-main.h"

#include <stdio.h>

int fe_frontend_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve frontend: not implemented yet\n");
  return 2;
}
