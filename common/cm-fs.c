/* cm-fs.c — cm_mkdir_p with mkdir(2), cm_rmtree with nftw(3) walking
 * physically (FTW_PHYS: links are reported, not followed) and depth first
 * (FTW_DEPTH: a folder's entries before the folder). */
#include "common/cm-fs.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"

static int from_errno(int e) {
  switch (e) {
  case ENOENT: return CM_ERR_NOENT;
  case ENOMEM: return CM_ERR_NOMEM;
  case ENAMETOOLONG: return CM_ERR_TOOBIG;
  default: return CM_ERR_IO;
  }
}

/* mkdir of one prefix; an existing folder (or link to one) is success. */
static int make_one(const char *dir, mode_t mode) {
  if (mkdir(dir, mode) == 0) return 0;
  int e = errno;
  if (e == EEXIST) {
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    errno = ENOTDIR;
    return CM_ERR_IO;
  }
  errno = e;
  return from_errno(e);
}

int cm_mkdir_p(const char *path, mode_t mode) {
  if (!path || !*path) {
    errno = EINVAL;
    return CM_ERR_INVAL;
  }
  size_t n = strlen(path);
  if (n >= PATH_MAX) {
    errno = ENAMETOOLONG;
    return CM_ERR_TOOBIG;
  }
  char buf[PATH_MAX];
  memcpy(buf, path, n + 1);
  while (n > 1 && buf[n - 1] == '/') /* "a/b/" is "a/b" */
    buf[--n] = 0;
  /* each prefix that ends before a '/' (skipping the root and runs of '/') */
  for (size_t i = 1; i < n; i++) {
    if (buf[i] != '/' || buf[i - 1] == '/') continue;
    buf[i] = 0;
    int rc = make_one(buf, mode);
    buf[i] = '/';
    if (rc) return rc;
  }
  return make_one(buf, mode);
}

/* ---- cm_rmtree --------------------------------------------------------------
 * nftw's callback takes no user pointer: the first error of the walk in
 * progress is kept per thread. */

static _Thread_local int t_first_err, t_first_errno;

static void note_error(int e) {
  if (t_first_err) return;
  t_first_err = from_errno(e);
  t_first_errno = e;
}

static int remove_entry(const char *p, const struct stat *st, int type, struct FTW *f) {
  (void)st;
  (void)f;
  /* FTW_DP: a folder whose entries were visited; FTW_DNR: one that could not
   * be read (rmdir then fails unless it is empty); everything else, links
   * (FTW_SL, FTW_SLN) included, is unlinked as itself */
  int rc = type == FTW_DP || type == FTW_DNR ? rmdir(p) : unlink(p);
  if (rc != 0 && errno != ENOENT) note_error(errno);
  return 0; /* go on: remove whatever can be removed */
}

int cm_rmtree(const char *path) {
  if (!path || !*path) {
    errno = EINVAL;
    return CM_ERR_INVAL;
  }
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return 0;
    return from_errno(errno);
  }
  if (!S_ISDIR(st.st_mode)) { /* a file or a link: remove just that */
    if (unlink(path) != 0 && errno != ENOENT) return from_errno(errno);
    return 0;
  }
  t_first_err = 0;
  t_first_errno = 0;
  if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) note_error(errno);
  if (t_first_err) errno = t_first_errno;
  return t_first_err;
}

const char *cm_base_name(const char *path) {
  const char *b = strrchr(path, '/');
  return b ? b + 1 : path;
}
