/* cm-err.h — lmserve's error codes: negative ints, 0 is success.
 *
 * Anything that input or the environment can cause returns one of these;
 * bugs use CM_ASSERT (cm-assert.h) instead. */
#ifndef LMSERVE_CM_ERR_H
#define LMSERVE_CM_ERR_H

#include <stdarg.h>
#include <stddef.h>

enum cm_err {
  CM_OK = 0,
  CM_ERR_NOMEM = -1,      /* allocation failed or a size cap was hit */
  CM_ERR_INVAL = -2,      /* invalid argument or value */
  CM_ERR_IO = -3,         /* read/write/socket failure */
  CM_ERR_NOENT = -4,      /* file or object not found */
  CM_ERR_PARSE = -5,      /* malformed input (JSON, msgpack, HTTP, ...) */
  CM_ERR_TRUNC = -6,      /* input ends before a declared length */
  CM_ERR_TOOBIG = -7,     /* a declared length or count exceeds a limit */
  CM_ERR_DEPTH = -8,      /* nesting deeper than allowed */
  CM_ERR_UNKNOWN = -9,    /* unknown message type / field / enum value */
  CM_ERR_VERSION = -10,   /* unsupported protocol or format version */
  CM_ERR_UNSUPPORTED = -11, /* valid but not supported (dtype, model_type, ...) */
  CM_ERR_SHAPE = -12,     /* tensor shape mismatch */
  CM_ERR_TIMEOUT = -13,
  CM_ERR_AGAIN = -14,     /* would block / try later */
  CM_ERR_CLOSED = -15,    /* peer or object closed */
  CM_ERR_FULL = -16,      /* queue or pool full */
  CM_ERR_STATE = -17,     /* operation not valid in the current state */
  CM_ERR_DEVICE = -18,    /* accelerator (CUDA/NCCL) failure */
  CM_ERR_RANGE = -19,     /* value out of range */
  CM_ERR__LAST = -20,
};

/* A static, human-readable name for an error code ("invalid argument"). */
const char *cm_strerror(int err);

/* The one way to report an error with a message: formats into err[errlen] (when err is
 * non-NULL and errlen > 0; the text is always NUL-terminated, truncated to fit) and
 * returns code, so that a failing path reads `return cm_fail(err, errlen, CM_ERR_X, ...)`.
 * cm_vfail is the same over a va_list (for wrappers that add context). */
int cm_fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int cm_vfail(char *err, size_t errlen, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif
