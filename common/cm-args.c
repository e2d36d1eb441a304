/* cm-args.c — flag parsing for subcommands (see cm-args.h). */
#include "common/cm-args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"

int cm_parse_i64(const char *s, int64_t *out) {
  if (!s || !*s) return CM_ERR_INVAL;
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end) return CM_ERR_INVAL;
  if (errno == ERANGE) return CM_ERR_RANGE;
  *out = (int64_t)v;
  return CM_OK;
}

int cm_parse_double(const char *s, double *out) {
  if (!s || !*s) return CM_ERR_INVAL;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || !isfinite(v)) return CM_ERR_INVAL;
  *out = v;
  return CM_OK;
}

int cm_parse_size(const char *s, uint64_t *out) {
  if (!s || !*s || *s == '-') return CM_ERR_INVAL;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno == ERANGE || !(v >= 0)) return CM_ERR_INVAL;
  double mul = 1;
  switch (*end) {
  case 'k':
  case 'K':
    mul = 1024.0;
    end++;
    break;
  case 'm':
  case 'M':
    mul = 1024.0 * 1024;
    end++;
    break;
  case 'g':
  case 'G':
    mul = 1024.0 * 1024 * 1024;
    end++;
    break;
  case 't':
  case 'T':
    mul = 1024.0 * 1024 * 1024 * 1024;
    end++;
    break;
  default: break;
  }
  if (mul > 1 && *end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return CM_ERR_INVAL;
  v *= mul;
  if (v > 1.8e19) return CM_ERR_INVAL;
  *out = (uint64_t)v;
  return CM_OK;
}

void cm_args_usage(FILE *f, const char *prog, const char *summary, const struct cm_opt *opts) {
  fprintf(f, "usage: %s [options]\n", prog);
  if (summary) fprintf(f, "%s\n", summary);
  fprintf(f, "\noptions:\n");
  for (const struct cm_opt *o = opts; o && o->name; o++) {
    char left[96];
    if (o->kind == CM_OPT_BOOL)
      snprintf(left, sizeof(left), "--%s / --no-%s", o->name, o->name);
    else
      snprintf(left, sizeof(left), "--%s %s", o->name, o->metavar ? o->metavar : "VALUE");
    fprintf(f, "  %-36s %s\n", left, o->help ? o->help : "");
  }
  fprintf(f, "  %-36s %s\n", "-h, --help", "show this help");
}

static const struct cm_opt *find_opt(const struct cm_opt *opts, const char *name, size_t len,
                                     int *negated) {
  *negated = 0;
  for (const struct cm_opt *o = opts; o && o->name; o++)
    if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
  if (len > 3 && strncmp(name, "no-", 3) == 0) {
    for (const struct cm_opt *o = opts; o && o->name; o++)
      if (o->kind == CM_OPT_BOOL && strlen(o->name) == len - 3 &&
          strncmp(o->name, name + 3, len - 3) == 0) {
        *negated = 1;
        return o;
      }
  }
  return NULL;
}

static int set_value(const char *prog, const struct cm_opt *o, const char *val) {
  int rc;
  switch (o->kind) {
  case CM_OPT_STR: *(const char **)o->out = val; return CM_OK;
  case CM_OPT_INT: {
    int64_t v;
    rc = cm_parse_i64(val, &v);
    if (rc) {
      fprintf(stderr, "%s: --%s expects an integer, got '%s'\n", prog, o->name, val);
      return CM_ERR_INVAL;
    }
    if (o->min < o->max && (v < o->min || v > o->max)) {
      fprintf(stderr, "%s: --%s must be between %lld and %lld, got %lld\n", prog, o->name,
              (long long)o->min, (long long)o->max, (long long)v);
      return CM_ERR_RANGE;
    }
    *(int64_t *)o->out = v;
    return CM_OK;
  }
  case CM_OPT_DOUBLE: {
    double v;
    if (cm_parse_double(val, &v)) {
      fprintf(stderr, "%s: --%s expects a number, got '%s'\n", prog, o->name, val);
      return CM_ERR_INVAL;
    }
    if (o->dmin < o->dmax && (v < o->dmin || v > o->dmax)) {
      fprintf(stderr, "%s: --%s must be between %g and %g, got %g\n", prog, o->name, o->dmin,
              o->dmax, v);
      return CM_ERR_RANGE;
    }
    *(double *)o->out = v;
    return CM_OK;
  }
  case CM_OPT_SIZE: {
    uint64_t v;
    if (cm_parse_size(val, &v)) {
      fprintf(stderr, "%s: --%s expects a size in bytes (e.g. 512M, 4G), got '%s'\n", prog, o->name,
              val);
      return CM_ERR_INVAL;
    }
    *(uint64_t *)o->out = v;
    return CM_OK;
  }
  case CM_OPT_STRS: {
    struct cm_strs *l = o->out;
    for (const char *p = val;;) {
      const char *comma = strchr(p, ',');
      size_t n = comma ? (size_t)(comma - p) : strlen(p);
      if (n == 0) {
        fprintf(stderr, "%s: --%s: an empty value in '%s'\n", prog, o->name, val);
        return CM_ERR_INVAL;
      }
      if (l->n >= CM_STRS_MAX) {
        fprintf(stderr, "%s: --%s: at most %d values\n", prog, o->name, CM_STRS_MAX);
        return CM_ERR_INVAL;
      }
      if (!(l->v[l->n] = strndup(p, n))) return CM_ERR_NOMEM;
      l->n++;
      if (!comma) return CM_OK;
      p = comma + 1;
    }
  }
  case CM_OPT_BOOL: break;
  }
  return CM_ERR_INVAL;
}

void cm_strs_free(struct cm_strs *s) {
  for (int i = 0; i < s->n; i++)
    free(s->v[i]);
  s->n = 0;
}

int cm_args_parse(const char *prog, const char *summary, const struct cm_opt *opts, int argc,
                  char **argv, int first, const char **positional, int max_positional,
                  int *n_positional) {
  int npos = 0;
  int only_positional = 0;
  for (int i = first; i < argc; i++) {
    const char *a = argv[i];
    if (!only_positional && (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)) {
      cm_args_usage(stdout, prog, summary, opts);
      return CM_ARGS_HELP;
    }
    if (!only_positional && strcmp(a, "--") == 0) {
      only_positional = 1;
      continue;
    }
    if (only_positional || a[0] != '-' || a[1] == 0) {
      if (npos >= max_positional) {
        fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", prog, a);
        return CM_ERR_INVAL;
      }
      positional[npos++] = a;
      continue;
    }
    if (a[1] != '-') {
      fprintf(stderr, "%s: unknown option '%s' (see --help)\n", prog, a);
      return CM_ERR_INVAL;
    }
    const char *name = a + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    int negated;
    const struct cm_opt *o = find_opt(opts, name, len, &negated);
    if (!o) {
      fprintf(stderr, "%s: unknown option '--%.*s' (see --help)\n", prog, (int)len, name);
      return CM_ERR_INVAL;
    }
    if (o->seen) *o->seen = 1;
    if (o->kind == CM_OPT_BOOL) {
      if (eq) {
        const char *v = eq + 1;
        if (negated) {
          fprintf(stderr, "%s: --%.*s takes no value\n", prog, (int)len, name);
          return CM_ERR_INVAL;
        }
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes"))
          *(int *)o->out = 1;
        else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no"))
          *(int *)o->out = 0;
        else {
          fprintf(stderr, "%s: --%s expects true or false, got '%s'\n", prog, o->name, v);
          return CM_ERR_INVAL;
        }
      } else {
        *(int *)o->out = negated ? 0 : 1;
      }
      continue;
    }
    const char *val;
    if (eq) {
      val = eq + 1;
    } else {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s: --%s needs a value (%s)\n", prog, o->name,
                o->metavar ? o->metavar : "VALUE");
        return CM_ERR_INVAL;
      }
      val = argv[++i];
    }
    int rc = set_value(prog, o, val);
    if (rc) return rc;
  }
  if (n_positional) *n_positional = npos;
  return CM_ARGS_OK;
}
