/* test-fs.c — cm_mkdir_p and cm_rmtree on real folders under $TMPDIR:
 * nested trees, links that point out of the tree (their targets survive),
 * paths that exist already, and paths that cannot be made. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "tests/harness/th.h"

/* A fresh folder of its own for each test; removed by the test's last check. */
static void scratch(char *dir, size_t n, const char *name) {
  const char *t = getenv("TMPDIR");
  snprintf(dir, n, "%s/lmserve-fs-%s-XXXXXX", t && *t ? t : "/tmp", name);
  TH_REQUIRE(mkdtemp(dir) != NULL);
}

static void put_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TH_REQUIRE(fd >= 0);
  TH_REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
}

/* dir/name: a symbolic link to target. */
static void put_link(const char *dir, const char *name, const char *target) {
  char p[600];
  snprintf(p, sizeof(p), "%s/%s", dir, name);
  TH_REQUIRE(symlink(target, p) == 0);
}

static int is_dir(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

TH_TEST(fs_nested_dirs) {
  char root[256], p[512], f[600];
  scratch(root, sizeof(root), "nested");
  snprintf(p, sizeof(p), "%s/a/b/c/d", root);
  TH_CHECK_EQ_INT(cm_mkdir_p(p, 0755), 0);
  TH_CHECK(is_dir(p));
  /* mode reaches the new folders (less the umask) */
  mode_t um = umask(0);
  umask(um);
  snprintf(p, sizeof(p), "%s/m/n", root);
  TH_CHECK_EQ_INT(cm_mkdir_p(p, 0750), 0);
  struct stat st;
  TH_REQUIRE(stat(p, &st) == 0);
  TH_CHECK_EQ_INT(st.st_mode & 0777, 0750 & ~um);
  /* doubled and trailing slashes are what mkdir -p makes of them */
  snprintf(p, sizeof(p), "%s//x///y/", root);
  TH_CHECK_EQ_INT(cm_mkdir_p(p, 0755), 0);
  snprintf(p, sizeof(p), "%s/x/y", root);
  TH_CHECK(is_dir(p));
  /* files at every level, then the whole tree goes */
  const char *files[] = {"f0", "a/f1", "a/b/f2", "a/b/c/f3", "a/b/c/d/f4", "m/n/f5"};
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
    snprintf(f, sizeof(f), "%s/%s", root, files[i]);
    put_file(f, "x");
  }
  snprintf(p, sizeof(p), "%s/a", root);
  TH_CHECK_EQ_INT(cm_rmtree(p), 0);
  TH_CHECK(!exists(p));
  snprintf(p, sizeof(p), "%s/m/n", root);
  TH_CHECK(is_dir(p)); /* a sibling stays */
  TH_CHECK_EQ_INT(cm_rmtree(root), 0);
  TH_CHECK(!exists(root));
}

TH_TEST(fs_rmtree_never_follows_links) {
  char root[256], out[256], p[512], q[512];
  scratch(root, sizeof(root), "tree");
  scratch(out, sizeof(out), "outside");
  snprintf(p, sizeof(p), "%s/keep", out);
  put_file(p, "precious");
  snprintf(p, sizeof(p), "%s/sub/deeper", out);
  TH_REQUIRE(cm_mkdir_p(p, 0755) == 0);
  snprintf(p, sizeof(p), "%s/sub/deeper/keep2", out);
  put_file(p, "also");

  /* the tree: a link to the outside folder, a link to a file outside, a
   * dangling link, and a link inside the tree to another part of it */
  snprintf(p, sizeof(p), "%s/inner/sub", root);
  TH_REQUIRE(cm_mkdir_p(p, 0755) == 0);
  put_link(root, "inner/to-outside", out);
  snprintf(q, sizeof(q), "%s/keep", out);
  put_link(root, "inner/sub/to-file", q);
  put_link(root, "dangling", "/nonexistent/lmserve-fs-target");
  snprintf(q, sizeof(q), "%s/inner/sub", root);
  put_link(root, "loop", q);

  TH_CHECK_EQ_INT(cm_rmtree(root), 0);
  TH_CHECK(!exists(root));
  snprintf(p, sizeof(p), "%s/keep", out);
  TH_CHECK(exists(p));
  snprintf(p, sizeof(p), "%s/sub/deeper/keep2", out);
  TH_CHECK(exists(p));

  /* a path that is itself a link: only the link goes */
  snprintf(p, sizeof(p), "%s/self-link", out);
  snprintf(q, sizeof(q), "%s/sub", out);
  TH_REQUIRE(symlink(q, p) == 0);
  TH_CHECK_EQ_INT(cm_rmtree(p), 0);
  TH_CHECK(!exists(p));
  snprintf(p, sizeof(p), "%s/sub/deeper/keep2", out);
  TH_CHECK(exists(p));

  TH_CHECK_EQ_INT(cm_rmtree(out), 0);
  TH_CHECK(!exists(out));
}

TH_TEST(fs_existing_paths) {
  char root[256], p[512];
  scratch(root, sizeof(root), "existing");
  TH_CHECK_EQ_INT(cm_mkdir_p(root, 0755), 0); /* exists: fine, and again */
  TH_CHECK_EQ_INT(cm_mkdir_p(root, 0755), 0);
  TH_CHECK_EQ_INT(cm_mkdir_p("/", 0755), 0);
  /* a link to a folder counts as the folder */
  snprintf(p, sizeof(p), "%s/real", root);
  TH_REQUIRE(cm_mkdir_p(p, 0755) == 0);
  char ln[512];
  snprintf(ln, sizeof(ln), "%s/alias", root);
  TH_REQUIRE(symlink(p, ln) == 0);
  TH_CHECK_EQ_INT(cm_mkdir_p(ln, 0755), 0);
  snprintf(p, sizeof(p), "%s/alias/made-through", root);
  TH_CHECK_EQ_INT(cm_mkdir_p(p, 0755), 0);
  snprintf(p, sizeof(p), "%s/real/made-through", root);
  TH_CHECK(is_dir(p));
  /* removing what is not there is not an error (as rm -rf) */
  snprintf(p, sizeof(p), "%s/never-made/below", root);
  TH_CHECK_EQ_INT(cm_rmtree(p), 0);
  /* a plain file is removed as itself */
  snprintf(p, sizeof(p), "%s/file", root);
  put_file(p, "x");
  TH_CHECK_EQ_INT(cm_rmtree(p), 0);
  TH_CHECK(!exists(p));
  TH_CHECK_EQ_INT(cm_rmtree(root), 0);
  TH_CHECK(!exists(root));
}

TH_TEST(fs_paths_that_cannot_be_made) {
  char root[256], p[512];
  scratch(root, sizeof(root), "cannot");
  TH_CHECK_EQ_INT(cm_mkdir_p("", 0755), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(cm_mkdir_p(NULL, 0755), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(cm_rmtree(""), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(cm_rmtree(NULL), CM_ERR_INVAL);
  /* a file where a folder should be: as the last component, or in the middle */
  snprintf(p, sizeof(p), "%s/plain", root);
  put_file(p, "x");
  errno = 0;
  TH_CHECK(cm_mkdir_p(p, 0755) < 0);
  TH_CHECK_EQ_INT(errno, ENOTDIR);
  snprintf(p, sizeof(p), "%s/plain/sub/dir", root);
  TH_CHECK(cm_mkdir_p(p, 0755) < 0);
  snprintf(p, sizeof(p), "%s/plain/sub", root);
  TH_CHECK(!exists(p));
  /* longer than PATH_MAX */
  size_t n = PATH_MAX + 16;
  char *longp = malloc(n + 1);
  TH_REQUIRE(longp);
  memset(longp, 'a', n);
  longp[0] = '/';
  longp[n] = 0;
  TH_CHECK_EQ_INT(cm_mkdir_p(longp, 0755), CM_ERR_TOOBIG);
  free(longp);
  /* a component name longer than the file system allows */
  char name[400];
  memset(name, 'b', sizeof(name) - 1);
  name[sizeof(name) - 1] = 0;
  char lp[sizeof(root) + sizeof(name) + 8];
  snprintf(lp, sizeof(lp), "%s/%s/c", root, name);
  TH_CHECK_EQ_INT(cm_mkdir_p(lp, 0755), CM_ERR_TOOBIG);
  /* permissions (root bypasses them, so only as another user) */
  if (geteuid() != 0) {
    snprintf(p, sizeof(p), "%s/locked", root);
    TH_REQUIRE(cm_mkdir_p(p, 0755) == 0);
    char inside[600];
    snprintf(inside, sizeof(inside), "%s/locked/f", root);
    put_file(inside, "x");
    TH_REQUIRE(chmod(p, 0555) == 0);
    snprintf(inside, sizeof(inside), "%s/locked/new/dir", root);
    TH_CHECK_EQ_INT(cm_mkdir_p(inside, 0755), CM_ERR_IO);
    /* the walk reports the failure and removes what it can */
    snprintf(inside, sizeof(inside), "%s/other", root);
    put_file(inside, "x");
    TH_CHECK(cm_rmtree(root) < 0);
    TH_CHECK(!exists(inside));
    TH_REQUIRE(chmod(p, 0755) == 0);
  }
  TH_CHECK_EQ_INT(cm_rmtree(root), 0);
  TH_CHECK(!exists(root));
}
