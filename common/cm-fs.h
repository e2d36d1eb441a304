/* cm-fs.h — making and removing folder trees without a shell: what
 * `mkdir -p` and `rm -rf` do, with system calls and cm_err codes; and a
 * path's last component.
 *
 * Both return 0 or a negative cm_err (cm-err.h) and leave errno as the
 * failing system call set it, so a caller can log strerror(errno). */
#ifndef LMSERVE_CM_FS_H
#define LMSERVE_CM_FS_H
#include <sys/types.h>

/* Creates path and every missing parent with mkdir(2) and mode (umask
 * applies). A component that already exists as a folder (or a symlink to
 * one) is fine. Returns 0; CM_ERR_INVAL for an empty path; CM_ERR_TOOBIG
 * when path is longer than PATH_MAX; CM_ERR_NOENT / CM_ERR_IO (a component
 * is a file, permission denied, read-only file system, ...) / CM_ERR_NOMEM
 * when some component cannot be made. */
int cm_mkdir_p(const char *path, mode_t mode);

/* Removes path and everything below it, depth first. Symbolic links are
 * removed, never followed: what a link inside the tree points to (in the
 * tree or outside it) is left alone, and a path that is itself a link loses
 * only the link. A path that does not exist is not an error. On a failure
 * the walk goes on removing what it can and the first error is returned:
 * CM_ERR_INVAL (empty path), CM_ERR_NOENT, CM_ERR_NOMEM or CM_ERR_IO. */
int cm_rmtree(const char *path);

/* The last component of path (after its last '/'; path itself without one). */
const char *cm_base_name(const char *path);

#endif
