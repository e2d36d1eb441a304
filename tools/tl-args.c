/* tl-args.c — the flag parsing every tools subcommand starts with, and the
 * benchmarks' sort order (see tl-main.h). */
#include "common/cm-args.h"
#include "tools/tl-main.h"

int tl_args_parse(const char *prog, const char *summary, const struct cm_opt *opts, int argc,
                  char **argv) {
  int rc = cm_args_parse(prog, summary, opts, argc, argv, 1, NULL, 0, NULL);
  if (rc == CM_ARGS_HELP) return 0;
  return rc < 0 ? 2 : -1;
}

int tl_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
