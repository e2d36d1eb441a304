/* cm-args.h — command-line flags for lmserve's subcommands.
 *
 * A subcommand declares a table of struct cm_opt ending with {0}; cm_args_parse
 * fills the `out` pointers. Accepted forms: `--name value`, `--name=value`,
 * and for booleans `--name` / `--no-name`. Numbers are checked for syntax
 * and range; sizes accept K/M/G/T (powers of 1024, optional "iB"/"B").
 * Every mistake is reported on stderr as one clear line naming the flag. */
#ifndef LMSERVE_CM_ARGS_H
#define LMSERVE_CM_ARGS_H
#include <stdint.h>
#include <stdio.h>

enum cm_opt_kind {
  CM_OPT_BOOL,   /* int *out: --name sets 1, --no-name sets 0 */
  CM_OPT_STR,    /* const char **out (points into argv) */
  CM_OPT_INT,    /* int64_t *out, within [min, max] when min < max */
  CM_OPT_DOUBLE, /* double *out, within [dmin, dmax] when dmin < dmax */
  CM_OPT_SIZE,   /* uint64_t *out: bytes, "4G", "512MiB", "1000000" */
  CM_OPT_STRS,   /* struct cm_strs *out: every value of a flag given several times (in order),
                    each also split at commas */
};

#define CM_STRS_MAX 16
struct cm_strs {
  char *v[CM_STRS_MAX]; /* malloc'd copies: cm_strs_free */
  int n;
};
void cm_strs_free(struct cm_strs *s);

struct cm_opt {
  const char *name; /* without the leading "--" */
  enum cm_opt_kind kind;
  void *out;
  const char *metavar; /* e.g. "DIR", shown in usage */
  const char *help;
  int64_t min, max;  /* for CM_OPT_INT */
  double dmin, dmax; /* for CM_OPT_DOUBLE */
  int *seen;         /* optional: set to 1 when given */
};

enum {
  CM_ARGS_OK = 0,
  CM_ARGS_HELP = 1, /* --help/-h was given and usage printed: exit 0 */
};

/* Parses argv[first..argc). Positional arguments are collected into
 * `positional` (up to max_positional; more is an error). Returns CM_ARGS_OK,
 * CM_ARGS_HELP, or a negative cm_err after printing the problem. */
int cm_args_parse(const char *prog, const char *summary, const struct cm_opt *opts, int argc,
                  char **argv, int first, const char **positional, int max_positional,
                  int *n_positional);

void cm_args_usage(FILE *f, const char *prog, const char *summary, const struct cm_opt *opts);

/* Parses a byte size ("4G", "512MiB", "123"); returns 0 or CM_ERR_INVAL. */
int cm_parse_size(const char *s, uint64_t *out);
/* Parses a whole decimal integer; returns 0 or CM_ERR_INVAL / CM_ERR_RANGE. */
int cm_parse_i64(const char *s, int64_t *out);
int cm_parse_double(const char *s, double *out);

#endif
