/* cm-proc.c — running another program without a shell (see cm-proc.h). */
#include "common/cm-proc.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-err.h"

extern char **environ;

int cm_run_capture(char *const argv[], char *out, size_t out_cap) {
  if (!argv || !argv[0] || !out || !out_cap) return CM_ERR_INVAL;
  out[0] = 0;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) return CM_ERR_IO;
  posix_spawn_file_actions_t fa;
  int rc = CM_ERR_IO;
  if (posix_spawn_file_actions_init(&fa)) goto close_both;
  if (posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0) ||
      posix_spawn_file_actions_adddup2(&fa, fds[1], 1) ||
      posix_spawn_file_actions_adddup2(&fa, fds[1], 2)) {
    posix_spawn_file_actions_destroy(&fa);
    goto close_both;
  }
  pid_t pid;
  int err = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (err) {
    close(fds[0]);
    return err == ENOENT ? CM_ERR_NOENT : CM_ERR_IO;
  }
  size_t n = 0;
  char sink[4096];
  for (;;) {
    char *dst = n + 1 < out_cap ? out + n : sink;
    size_t room = n + 1 < out_cap ? out_cap - 1 - n : sizeof sink;
    ssize_t r = read(fds[0], dst, room);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (dst != sink) n += (size_t)r;
  }
  out[n] = 0;
  close(fds[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return CM_ERR_IO;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : CM_ERR_IO;
close_both:
  close(fds[0]);
  close(fds[1]);
  return rc;
}
