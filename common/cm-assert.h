/* cm-assert.h — CM_ASSERT: abort with file, line and expression. For bugs only:
 * never for anything input or the environment can cause (use cm-err.h codes).
 * Beside it, the small arithmetic every part uses (CM_MIN, CM_MAX, cm_gcd). */
#ifndef LMSERVE_CM_ASSERT_H
#define LMSERVE_CM_ASSERT_H

_Noreturn void cm_assert_fail(const char *expr, const char *file, int line, const char *func);

#define CM_ASSERT(expr) \
  ((expr) ? (void)0 : cm_assert_fail(#expr, __FILE__, __LINE__, __func__))

#define CM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CM_MAX(a, b) ((a) > (b) ? (a) : (b))

/* The greatest common divisor (cm_gcd(a, 0) = a). */
static inline unsigned long long cm_gcd(unsigned long long a, unsigned long long b) {
  while (b) {
    unsigned long long r = a % b;
    a = b;
    b = r;
  }
  return a;
}

#endif
