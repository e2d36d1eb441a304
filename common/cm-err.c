/* cm-err.c — names for lmserve's error codes and the one error-reporting helper. */
#include "common/cm-err.h"

#include <stdio.h>

const char *cm_strerror(int err) {
  switch (err) {
  case CM_OK: return "success";
  case CM_ERR_NOMEM: return "out of memory or over a size cap";
  case CM_ERR_INVAL: return "invalid argument";
  case CM_ERR_IO: return "input/output error";
  case CM_ERR_NOENT: return "not found";
  case CM_ERR_PARSE: return "malformed input";
  case CM_ERR_TRUNC: return "input truncated";
  case CM_ERR_TOOBIG: return "length exceeds limit";
  case CM_ERR_DEPTH: return "nesting too deep";
  case CM_ERR_UNKNOWN: return "unknown type or field";
  case CM_ERR_VERSION: return "unsupported version";
  case CM_ERR_UNSUPPORTED: return "unsupported";
  case CM_ERR_SHAPE: return "shape mismatch";
  case CM_ERR_TIMEOUT: return "timed out";
  case CM_ERR_AGAIN: return "try again";
  case CM_ERR_CLOSED: return "closed";
  case CM_ERR_FULL: return "full";
  case CM_ERR_STATE: return "invalid state";
  case CM_ERR_DEVICE: return "device error";
  case CM_ERR_RANGE: return "out of range";
  default: return "unknown error";
  }
}

int cm_vfail(char *err, size_t errlen, int code, const char *fmt, va_list ap) {
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  return code;
}

int cm_fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cm_vfail(err, errlen, code, fmt, ap);
  va_end(ap);
  return code;
}
