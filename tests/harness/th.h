/* th.h — lmserve's unit-test harness.
 *
 *   TH_TEST(arena_caps) { ... TH_CHECK(x == 1); TH_CHECK_EQ_INT(a, b); }
 *
 * Tests register themselves at load time; th-main.c's main() runs them in
 * order (or only those named on the command line, or all but those named
 * !NAME; a name that is no test's fails), prints one line per test
 * and exits 0 when all passed, 1 when any failed, 77 (meson's "skipped")
 * when every test skipped. A failed check records the failure and the test
 * goes on; TH_REQUIRE stops the test. TH_SKIP stops it and says why, loudly. */
#ifndef LMSERVE_TH_H
#define LMSERVE_TH_H
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*th_fn)(void);
void th_register(const char *name, th_fn fn);
void th_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
_Noreturn void th_stop(void);
_Noreturn void th_skip(const char *file, int line, const char *why);
/* Path of the source tree's tests/ folder (for fixtures), from TH_TESTS_DIR. */
const char *th_tests_dir(void);
/* Path of the build directory (where `lmserve` lives), from TH_BUILD_DIR. */
const char *th_build_dir(void);

#define TH_TEST(name) \
  static void th_test_##name(void); \
  __attribute__((constructor)) static void th_reg_##name(void) { \
    th_register(#name, th_test_##name); \
  } \
  static void th_test_##name(void)

#define TH_CHECK(cond) \
  do { \
    if (!(cond)) th_fail(__FILE__, __LINE__, "check failed: %s", #cond); \
  } while (0)

#define TH_REQUIRE(cond) \
  do { \
    if (!(cond)) { \
      th_fail(__FILE__, __LINE__, "requirement failed: %s", #cond); \
      th_stop(); \
    } \
  } while (0)

#define TH_CHECK_EQ_INT(a, b) \
  do { \
    long long th_a_ = (long long)(a), th_b_ = (long long)(b); \
    if (th_a_ != th_b_) \
      th_fail(__FILE__, __LINE__, "%s == %s failed: %lld != %lld", #a, #b, th_a_, th_b_); \
  } while (0)

#define TH_CHECK_EQ_STR(a, b) \
  do { \
    const char *th_a_ = (a), *th_b_ = (b); \
    if (!th_a_ || !th_b_ || strcmp(th_a_, th_b_) != 0) \
      th_fail(__FILE__, __LINE__, "%s == %s failed: \"%s\" != \"%s\"", #a, #b, \
              th_a_ ? th_a_ : "(null)", th_b_ ? th_b_ : "(null)"); \
  } while (0)

#define TH_CHECK_NEAR(a, b, tol) \
  do { \
    double th_a_ = (double)(a), th_b_ = (double)(b), th_t_ = (double)(tol); \
    if (!(th_a_ - th_b_ <= th_t_ && th_b_ - th_a_ <= th_t_)) \
      th_fail(__FILE__, __LINE__, "%s ~= %s failed: %.9g vs %.9g (tol %g)", #a, #b, th_a_, \
              th_b_, th_t_); \
  } while (0)

#define TH_SKIP(why) th_skip(__FILE__, __LINE__, (why))

#endif
