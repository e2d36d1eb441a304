/* sch-main.c — the `lmserve scheduler` subcommand (not implemented yet). */
#include "scheduler/sch-main.h"

#include <stdio.h>

int sch_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "lmserve scheduler: not implemented yet\n");
  return 2;
}
