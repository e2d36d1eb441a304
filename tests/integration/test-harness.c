/* test-harness.c — the process harness itself: timeouts kill, children never
 * outlive the test, output is captured, stdin is fed. */
#include <errno.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

TH_TEST(run_captures_output_and_exit_code) {
  th_proc_init(60);
  char *out = NULL, *err = NULL;
  char *argv[] = {"sh", "-c", "cat; echo oops >&2; exit 3", NULL};
  int rc = th_run(argv, NULL, "hello", 5, 10000, &out, &err);
  TH_CHECK_EQ_INT(rc, 3);
  TH_CHECK_EQ_STR(out, "hello");
  TH_CHECK_EQ_STR(err, "oops\n");
  free(out);
  free(err);
}

TH_TEST(run_timeout_kills_the_whole_group) {
  th_proc_init(60);
  /* the shell starts a grandchild that would outlive it */
  char *argv[] = {"sh", "-c", "sleep 30 & echo $!; wait", NULL};
  char *out = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 300, &out, NULL);
  TH_CHECK_EQ_INT(rc, -ETIMEDOUT);
  pid_t grandchild = (pid_t)atoi(out);
  free(out);
  TH_REQUIRE(grandchild > 0);
  usleep(100 * 1000);
  /* gone, or a zombie waiting for init to reap it: never still running */
  char path[64], state = 'Z';
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)grandchild);
  FILE *f = fopen(path, "r");
  if (f) {
    if (fscanf(f, "%*d %*s %c", &state) != 1) state = '?';
    fclose(f);
  }
  TH_CHECK(state == 'Z' || state == 'X');
}

TH_TEST(spawn_stop_and_wait) {
  th_proc_init(60);
  struct th_proc p;
  char *argv[] = {"sleep", "30", NULL};
  TH_REQUIRE(th_proc_spawn(&p, argv, NULL, 0) == 0);
  TH_CHECK_EQ_INT(th_proc_wait(&p, 100), -ETIMEDOUT);
  th_proc_stop(&p, 2000);
  TH_CHECK(p.exited);
  TH_CHECK(WIFSIGNALED(p.status) && WTERMSIG(p.status) == SIGTERM);
}

TH_TEST(spawn_capture_env) {
  th_proc_init(60);
  struct th_proc p;
  char *argv[] = {"sh", "-c", "echo $TH_PROBE", NULL};
  char *env[] = {"TH_PROBE=value42", NULL};
  TH_REQUIRE(th_proc_spawn(&p, argv, env, 1) == 0);
  size_t n = 0;
  char *out = th_read_all(p.out_fd, 5000, &n);
  TH_CHECK_EQ_STR(out, "value42\n");
  free(out);
  TH_CHECK_EQ_INT(th_proc_wait(&p, 5000), 0);
  TH_CHECK(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0);
  th_proc_stop(&p, 100);
}
