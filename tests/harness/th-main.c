/* th-main.c — the runner behind th.h: runs registered tests, reports, exits
 * with meson's conventions (0 pass, 1 fail, 77 skip). Each test runs in the
 * same process; a crash fails the whole executable, which meson reports.
 * Arguments pick tests: NAME ... runs those, !NAME ... all but those (a long
 * executable split over two meson tests); a name that is no test's fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/harness/th.h"

#define TH_MAX_TESTS 1024

struct th_entry {
  const char *name;
  th_fn fn;
};

static struct th_entry g_tests[TH_MAX_TESTS];
static int g_ntests;
static int g_failed_checks;
static int g_skipped;
static jmp_buf g_jmp;

void th_register(const char *name, th_fn fn) {
  if (g_ntests >= TH_MAX_TESTS) {
    fprintf(stderr, "th: too many tests\n");
    abort();
  }
  g_tests[g_ntests].name = name;
  g_tests[g_ntests].fn = fn;
  g_ntests++;
}

void th_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "  %s:%d: ", file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  g_failed_checks++;
}

_Noreturn void th_stop(void) { longjmp(g_jmp, 1); }

_Noreturn void th_skip(const char *file, int line, const char *why) {
  fprintf(stderr, "  SKIPPED (%s:%d): %s\n", file, line, why);
  g_skipped = 1;
  longjmp(g_jmp, 2);
}

const char *th_tests_dir(void) {
  const char *d = getenv("TH_TESTS_DIR");
  return d ? d : "tests";
}

const char *th_build_dir(void) {
  const char *d = getenv("TH_BUILD_DIR");
  return d ? d : "build";
}

/* setjmp lives in its own frame so main's counters are never clobbered */
static void run_one(th_fn fn) {
  if (setjmp(g_jmp) == 0) fn();
}

/* Whether the arguments pick test `name`: with no arguments, or only
 * "!NAME" ones (all but those), every test; else those named. */
static int wanted(const char *name, int argc, char **argv) {
  int want = 1;
  for (int a = 1; a < argc; a++)
    if (argv[a][0] != '!') want = 0;
  for (int a = 1; a < argc; a++) {
    const int neg = argv[a][0] == '!';
    if (!strcmp(argv[a] + neg, name)) want = !neg;
  }
  return want;
}

int main(int argc, char **argv) {
  int passed = 0, failed = 0, skipped = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int a = 1; a < argc; a++) { /* a name that is no test's: a typo, not a pass */
    const char *name = argv[a] + (argv[a][0] == '!');
    int known = 0;
    for (int i = 0; i < g_ntests && !known; i++)
      known = !strcmp(name, g_tests[i].name);
    if (!known) {
      fprintf(stderr, "th: no test named %s\n", name);
      return 1;
    }
  }
  for (int i = 0; i < g_ntests; i++) {
    if (!wanted(g_tests[i].name, argc, argv)) continue;
    g_failed_checks = 0;
    g_skipped = 0;
    run_one(g_tests[i].fn);
    if (g_failed_checks) {
      printf("FAIL %s\n", g_tests[i].name);
      failed++;
    } else if (g_skipped) {
      printf("SKIP %s\n", g_tests[i].name);
      skipped++;
    } else {
      printf("ok   %s\n", g_tests[i].name);
      passed++;
    }
  }
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  if (failed) return 1;
  if (skipped && !passed) return 77;
  return 0;
}
