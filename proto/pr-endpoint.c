/* pr-endpoint.c — endpoint naming: the 0700 runtime directory that holds our
 * ipc sockets, and the mapping of bare names to ipc:// paths (see pr-zmq.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-log.h"
#include "proto/pr-zmq.h"

#define NAME_MAX_LEN 64 /* bytes of a bare endpoint name */

/* Creates every missing component of `path` with mode 0700. */
static int mkdir_p(char *path) {
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != 0) continue;
    char c = *p;
    *p = 0;
    int r = mkdir(path, 0700);
    int e = errno;
    *p = c;
    if (r != 0 && e != EEXIST) {
      cm_error("pr", "mkdir %s: %s", path, strerror(e));
      return CM_ERR_IO;
    }
    if (!c) return 0;
  }
}

int pr_runtime_dir(const char *base, char *out, size_t out_len) {
  const char *env;
  int n;
  if (base && *base)
    n = snprintf(out, out_len, "%s", base);
  else if ((env = getenv("LMSERVE_RUNTIME_DIR")) && *env)
    n = snprintf(out, out_len, "%s", env);
  else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
    n = snprintf(out, out_len, "%s/lmserve", env);
  else
    n = snprintf(out, out_len, "/tmp/lmserve-%u", (unsigned)geteuid());
  if (n < 0 || (size_t)n >= out_len) return CM_ERR_TOOBIG;
  while (n > 1 && out[n - 1] == '/')
    out[--n] = 0;
  if (out[0] != '/') {
    cm_error("pr", "runtime directory %s: not an absolute path", out);
    return CM_ERR_INVAL;
  }
  int rc = mkdir_p(out);
  if (rc) return rc;
  struct stat st;
  if (lstat(out, &st) != 0) {
    cm_error("pr", "stat %s: %s", out, strerror(errno));
    return CM_ERR_IO;
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
    cm_error("pr", "runtime directory %s: not a directory owned by uid %u", out,
             (unsigned)geteuid());
    return CM_ERR_INVAL;
  }
  if ((st.st_mode & 0777) != 0700 && chmod(out, 0700) != 0) {
    cm_error("pr", "chmod 0700 %s: %s", out, strerror(errno));
    return CM_ERR_IO;
  }
  return 0;
}

static int has_prefix(const char *s, const char *p) {
  return strncmp(s, p, strlen(p)) == 0;
}

int pr_endpoint(const char *dir, const char *name, char *out, size_t out_len) {
  int n;
  if (!name || !*name) return CM_ERR_INVAL;
  if (has_prefix(name, "tcp://") || has_prefix(name, "ipc://") || has_prefix(name, "inproc://")) {
    n = snprintf(out, out_len, "%s", name);
    if (n < 0 || (size_t)n >= out_len) return CM_ERR_TOOBIG;
    if (has_prefix(name, "ipc://") &&
        strlen(name) - 6 >= sizeof(((struct sockaddr_un *)0)->sun_path))
      return CM_ERR_TOOBIG;
    return 0;
  }
  size_t len = strlen(name);
  if (len > NAME_MAX_LEN || strchr(name, ':')) return CM_ERR_INVAL;
  for (size_t i = 0; i < len; i++) {
    char c = name[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    if (!ok) return CM_ERR_INVAL;
  }
  if (name[0] == '.') return CM_ERR_INVAL; /* no "..", no hidden files */
  if (!dir || !*dir) return CM_ERR_INVAL;
  n = snprintf(out, out_len, "ipc://%s/%s.sock", dir, name);
  if (n < 0 || (size_t)n >= out_len) return CM_ERR_TOOBIG;
  /* the path (after "ipc://") must fit in sockaddr_un.sun_path with its NUL */
  if ((size_t)n - 6 >= sizeof(((struct sockaddr_un *)0)->sun_path)) return CM_ERR_TOOBIG;
  return 0;
}
