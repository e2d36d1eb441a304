/* th-proc.c — child processes for integration tests (see th-proc.h). */
#include "tests/harness/th-proc.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-fs.h"
#include "common/cm-proc.h"
#include "tests/harness/th.h"

#define TH_MAX_CHILDREN 64

static volatile pid_t g_children[TH_MAX_CHILDREN];

static void track(pid_t pid) {
  for (int i = 0; i < TH_MAX_CHILDREN; i++)
    if (g_children[i] == 0) {
      g_children[i] = pid;
      return;
    }
}

static void untrack(pid_t pid) {
  for (int i = 0; i < TH_MAX_CHILDREN; i++)
    if (g_children[i] == pid) g_children[i] = 0;
}

static void kill_all(void) {
  for (int i = 0; i < TH_MAX_CHILDREN; i++) {
    pid_t pid = g_children[i];
    if (pid > 0) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
    }
  }
}

static void on_signal(int sig) {
  kill_all();
  if (sig == SIGALRM) {
    static const char msg[] = "th-proc: watchdog timeout, killing children\n";
    ssize_t w = write(2, msg, sizeof(msg) - 1);
    (void)w;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void th_proc_init(unsigned timeout_s) {
  static int done;
  if (!done) {
    done = 1;
    atexit(kill_all);
    int sigs[] = {SIGINT, SIGTERM, SIGALRM, SIGSEGV, SIGABRT, SIGBUS, SIGHUP};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
      signal(sigs[i], on_signal);
    signal(SIGPIPE, SIG_IGN);
  }
  /* tools/test scales meson's limits for the sanitized build (TH_TIME_SCALE):
   * the watchdog scales with them */
  const char *scale = getenv("TH_TIME_SCALE");
  unsigned k = scale && atoi(scale) > 0 ? (unsigned)atoi(scale) : 1;
  if (timeout_s) alarm(timeout_s * k);
}

/* The child side of a spawn: its own process group, killed when the parent dies
 * (and at once when it already has), stdin/stdout/stderr from fds (-1: inherited),
 * env added to the environment, then argv[0] in place of the test's image. */
static _Noreturn void child_exec(pid_t parent, const int fds[3], char *const argv[],
                                 char *const env[]) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  signal(SIGPIPE, SIG_DFL);
  for (int i = 0; i < 3; i++)
    if (fds[i] >= 0) dup2(fds[i], i);
  for (int i = 0; env && env[i]; i++)
    putenv(env[i]);
  execvp(argv[0], argv);
  fprintf(stderr, "th-proc: exec %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

int th_proc_spawn(struct th_proc *p, char *const argv[], char *const env[], int capture) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  memset(p, 0, sizeof(*p));
  p->out_fd = p->err_fd = -1;
  if (capture && (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))) {
    int e = errno;
    if (out[0] >= 0) close(out[0]), close(out[1]);
    return -e;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) child_exec(parent, (int[3]){-1, out[1], err[1]}, argv, env);
  setpgid(pid, pid);
  p->pid = pid;
  track(pid);
  if (capture) {
    close(out[1]);
    close(err[1]);
    p->out_fd = out[0];
    p->err_fd = err[0];
  }
  return 0;
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int th_proc_wait(struct th_proc *p, int timeout_ms) {
  if (p->exited || p->pid == 0) return 0;
  long long end = now_ms() + timeout_ms;
  for (;;) {
    int st;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) {
      p->status = st;
      p->exited = 1;
      untrack(p->pid);
      kill(-p->pid, SIGKILL); /* leave no grandchild behind */
      return 0;
    }
    if (r < 0 && errno != EINTR) {
      p->exited = 1;
      untrack(p->pid);
      return 0;
    }
    if (now_ms() >= end) return -ETIMEDOUT;
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

void th_proc_signal(struct th_proc *p, int sig) {
  if (p->pid > 0 && !p->exited) kill(-p->pid, sig);
}

int th_proc_check_exit(struct th_proc *p, int sig, int timeout_ms) {
  if (sig) th_proc_signal(p, sig);
  if (th_proc_wait(p, timeout_ms) != 0) {
    th_fail(__FILE__, __LINE__, "pid %d still running after %d ms", (int)p->pid, timeout_ms);
    return -1;
  }
  if (WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0) return 0;
  if (WIFEXITED(p->status))
    th_fail(__FILE__, __LINE__, "pid %d exited with status %d", (int)p->pid,
            WEXITSTATUS(p->status));
  else
    th_fail(__FILE__, __LINE__, "pid %d ended by signal %d", (int)p->pid, WTERMSIG(p->status));
  return 1;
}

void th_proc_stop(struct th_proc *p, int grace_ms) {
  if (p->pid > 0 && !p->exited) {
    kill(p->pid, SIGTERM);
    if (th_proc_wait(p, grace_ms) != 0) {
      kill(-p->pid, SIGKILL);
      kill(p->pid, SIGKILL);
      th_proc_wait(p, 5000);
    }
  }
  if (p->out_fd >= 0) close(p->out_fd);
  if (p->err_fd >= 0) close(p->err_fd);
  p->out_fd = p->err_fd = -1;
}

char *th_read_all(int fd, int timeout_ms, size_t *len) {
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  long long end = now_ms() + timeout_ms;
  for (;;) {
    long long left = end - now_ms();
    if (left <= 0) break;
    struct pollfd pfd = {fd, POLLIN, 0};
    int r = poll(&pfd, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (n + 4096 + 1 > cap) {
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) break;
      buf = nb;
    }
    ssize_t k = read(fd, buf + n, cap - n - 1);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    n += (size_t)k;
  }
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

int th_run(char *const argv[], char *const env[], const char *stdin_data, size_t stdin_len,
           int timeout_ms, char **out, char **err) {
  int in[2];
  if (pipe2(in, O_CLOEXEC)) return -errno;
  int outp[2], errp[2];
  if (pipe2(outp, O_CLOEXEC)) return -errno;
  if (pipe2(errp, O_CLOEXEC)) return -errno;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) child_exec(parent, (int[3]){in[0], outp[1], errp[1]}, argv, env);
  setpgid(pid, pid);
  track(pid);
  close(in[0]);
  close(outp[1]);
  close(errp[1]);
  /* feed stdin and drain both pipes together so neither side blocks */
  size_t in_off = 0, on = 0, en = 0, ocap = 4096, ecap = 4096;
  char *ob = malloc(ocap), *eb = malloc(ecap);
  int ofd = outp[0], efd = errp[0], ifd = in[1];
  if (!stdin_data || stdin_len == 0) {
    close(ifd);
    ifd = -1;
  } else {
    fcntl(ifd, F_SETFL, O_NONBLOCK);
  }
  long long end = now_ms() + timeout_ms;
  int timed_out = 0;
  while (ofd >= 0 || efd >= 0) {
    long long left = end - now_ms();
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd pf[3];
    int np = 0, io = -1, ie = -1, ii = -1;
    if (ofd >= 0) io = np, pf[np++] = (struct pollfd){ofd, POLLIN, 0};
    if (efd >= 0) ie = np, pf[np++] = (struct pollfd){efd, POLLIN, 0};
    if (ifd >= 0) ii = np, pf[np++] = (struct pollfd){ifd, POLLOUT, 0};
    int r = poll(pf, (nfds_t)np, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (ii >= 0 && pf[ii].revents) {
      ssize_t k = write(ifd, stdin_data + in_off, stdin_len - in_off);
      if (k > 0) in_off += (size_t)k;
      if (k < 0 && errno != EAGAIN) in_off = stdin_len;
      if (in_off >= stdin_len) {
        close(ifd);
        ifd = -1;
      }
    }
    for (int w = 0; w < 2; w++) {
      int idx = w == 0 ? io : ie;
      if (idx < 0 || !pf[idx].revents) continue;
      char **b = w == 0 ? &ob : &eb;
      size_t *n = w == 0 ? &on : &en, *cap = w == 0 ? &ocap : &ecap;
      if (*n + 4097 > *cap) {
        *cap *= 2;
        *b = realloc(*b, *cap);
      }
      ssize_t k = read(pf[idx].fd, *b + *n, *cap - *n - 1);
      if (k > 0) {
        *n += (size_t)k;
      } else if (k == 0 || errno != EINTR) {
        close(pf[idx].fd);
        if (w == 0)
          ofd = -1;
        else
          efd = -1;
      }
    }
  }
  if (ifd >= 0) close(ifd);
  if (ofd >= 0) close(ofd);
  if (efd >= 0) close(efd);
  ob[on] = 0;
  eb[en] = 0;
  int st = 0, rc;
  if (timed_out) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    rc = -ETIMEDOUT;
  } else {
    long long left = end - now_ms();
    struct th_proc p = {.pid = pid, .out_fd = -1, .err_fd = -1};
    if (th_proc_wait(&p, left > 0 ? (int)left : 0) != 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      rc = -ETIMEDOUT;
    } else {
      st = p.status;
      rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
  }
  untrack(pid);
  if (out)
    *out = ob;
  else
    free(ob);
  if (err)
    *err = eb;
  else
    free(eb);
  return rc;
}

int th_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

int th_proc_wait_output(struct th_proc *p, const char *needle, int timeout_ms) {
  char seen[4096] = "";
  size_t got = 0;
  while (!strstr(seen, needle) && got < sizeof(seen) - 1) {
    struct pollfd pf = {p->out_fd, POLLIN, 0};
    if (poll(&pf, 1, timeout_ms) <= 0) return -1;
    ssize_t k = read(p->out_fd, seen + got, sizeof(seen) - 1 - got);
    if (k <= 0) return -1;
    got += (size_t)k;
    seen[got] = 0;
  }
  return strstr(seen, needle) ? 0 : -1;
}

/* ---- temporary folders and the tiny model --------------------------------- */

static char tmpdirs[8][256];

static void tmpdirs_remove(void) {
  for (int i = 0; i < 8; i++) {
    if (!tmpdirs[i][0]) continue;
    if (cm_rmtree(tmpdirs[i]))
      fprintf(stderr, "cleanup of %s failed: %s\n", tmpdirs[i], strerror(errno));
    tmpdirs[i][0] = 0;
  }
}

int th_tmpdir(const char *name, char *dir, size_t size) {
  int slot = 0;
  while (slot < 8 && tmpdirs[slot][0])
    slot++;
  if (slot == 8) return -1;
  const char *t = getenv("TMPDIR");
  int n = snprintf(tmpdirs[slot], sizeof(tmpdirs[slot]), "%s/lmserve-%s-XXXXXX",
                   t && *t ? t : "/tmp", name);
  if (n < 0 || (size_t)n >= sizeof(tmpdirs[slot]) || !mkdtemp(tmpdirs[slot])) {
    tmpdirs[slot][0] = 0;
    return -1;
  }
  static int registered;
  if (!registered++) atexit(tmpdirs_remove);
  n = snprintf(dir, size, "%s", tmpdirs[slot]);
  return n < 0 || (size_t)n >= size ? -1 : 0;
}

int th_tiny_gemma4(const char *dir, int seed, char *out, size_t size) {
  int n = snprintf(out, size, "%s/m", dir);
  if (n < 0 || (size_t)n >= size) return -1;
  char seed_s[16];
  snprintf(seed_s, sizeof(seed_s), "%d", seed);
  struct th_out o = {0};
  int rc = th_lmserve(&o, 120000, "make-tiny-model", "--arch", "gemma4", "--seed", seed_s, "--out",
                      out, NULL);
  if (rc) fprintf(stderr, "make-tiny-model: exit %d: %s\n", rc, o.err ? o.err : "");
  th_out_free(&o);
  if (rc) return -1;
  char tok[1100];
  snprintf(tok, sizeof(tok), "%s/tokenizer.json", out);
  return access(tok, R_OK) == 0 ? 0 : 1;
}

void th_tiny_gemma4_or_skip(const char *name, int seed, char *model, size_t size) {
  char tmp[256];
  TH_REQUIRE(th_tmpdir(name, tmp, sizeof(tmp)) == 0);
  int mk = th_tiny_gemma4(tmp, seed, model, size);
  TH_REQUIRE(mk >= 0);
  if (mk) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
}

/* ---- the process table ---------------------------------------------------------- */

/* /proc/PID/cmdline with its NULs as spaces, in buf (size bytes): 0, or -1 when there is
 * no such process or its command line is empty (a zombie's). */
static int cmdline_of(int pid, char *buf, size_t size) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t k = read(fd, buf, size - 1);
  close(fd);
  if (k <= 0) return -1;
  for (ssize_t i = 0; i < k; i++)
    if (!buf[i]) buf[i] = ' ';
  buf[k] = 0;
  return 0;
}

/* The parent of pid (from /proc/PID/stat), or -1. */
static int ppid_of(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t k = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (k <= 0) return -1;
  buf[k] = 0;
  const char *p = strrchr(buf, ')'); /* the name may hold spaces */
  int ppid = -1;
  char state;
  if (!p || sscanf(p + 1, " %c %d", &state, &ppid) != 2) return -1;
  return ppid;
}

/* 1 when cmdline holds each text of ap (up to a NULL). */
static int holds_all(const char *cmdline, va_list ap) {
  for (const char *t; (t = va_arg(ap, const char *));)
    if (!strstr(cmdline, t)) return 0;
  return 1;
}

int th_pid_with(int parent, ...) {
  DIR *d = opendir("/proc");
  if (!d) return -1;
  int found = -1;
  char buf[8192];
  struct dirent *de;
  while (found < 0 && (de = readdir(d))) {
    int pid = atoi(de->d_name);
    if (pid <= 0 || pid == getpid() || (parent > 0 && ppid_of(pid) != parent) ||
        cmdline_of(pid, buf, sizeof(buf)))
      continue;
    va_list ap;
    va_start(ap, parent);
    if (holds_all(buf, ap)) found = pid;
    va_end(ap);
  }
  closedir(d);
  return found;
}

int th_procs_with(const char *needle) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int n = 0;
  char buf[8192];
  struct dirent *de;
  while ((de = readdir(d))) {
    int pid = atoi(de->d_name);
    if (pid <= 0 || pid == getpid() || cmdline_of(pid, buf, sizeof(buf))) continue;
    n += strstr(buf, needle) != NULL;
  }
  closedir(d);
  return n;
}

/* ---- the lmserve binary ------------------------------------------------------ */

char *th_lmserve_bin(void) {
  char *b = getenv("LMSERVE_BIN");
  return b ? b : "build/tools/lmserve";
}

void th_out_free(struct th_out *o) {
  free(o->out);
  free(o->err);
  o->out = o->err = NULL;
}

static void argv_push(char **argv, int *n, char *a) {
  if (*n > TH_MAX_ARGS) {
    th_fail(__FILE__, __LINE__, "a command of more than %d arguments", TH_MAX_ARGS);
    th_stop();
  }
  argv[(*n)++] = a;
}

/* argv (TH_MAX_ARGS + 2 entries) = {prog, ap's arguments up to NULL, extra's up to NULL,
 * NULL}; more arguments than that fail the test. */
static void build_argv(char **argv, const char *prog, va_list ap, char *const *extra) {
  int n = 0;
  argv_push(argv, &n, (char *)prog);
  for (char *a; (a = va_arg(ap, char *));)
    argv_push(argv, &n, a);
  for (; extra && *extra; extra++)
    argv_push(argv, &n, *extra);
  argv[n] = NULL;
}

int th_lmserve(struct th_out *o, int timeout_ms, ...) {
  char *argv[TH_MAX_ARGS + 2];
  va_list ap;
  va_start(ap, timeout_ms);
  build_argv(argv, th_lmserve_bin(), ap, NULL);
  va_end(ap);
  th_out_free(o);
  return th_run(argv, NULL, NULL, 0, timeout_ms, &o->out, &o->err);
}

void th_lmserve_refusals(const struct th_refusal *cases, int n, int timeout_ms) {
  for (int i = 0; i < n; i++) {
    char *argv[TH_MAX_ARGS + 2], line[1024];
    int k = 0, len = snprintf(line, sizeof(line), "lmserve");
    argv_push(argv, &k, th_lmserve_bin());
    for (int a = 0; cases[i].args[a]; a++) {
      argv_push(argv, &k, (char *)cases[i].args[a]);
      if (len > 0 && (size_t)len < sizeof(line))
        len += snprintf(line + len, sizeof(line) - (size_t)len, " %s", cases[i].args[a]);
    }
    argv[k] = NULL;
    char *err = NULL;
    int rc = th_run(argv, NULL, NULL, 0, timeout_ms, NULL, &err);
    if (rc != cases[i].code || !err || !strstr(err, cases[i].says))
      th_fail(__FILE__, __LINE__, "`%s`: exit %d (want %d), stderr without \"%s\": %s", line, rc,
              cases[i].code, cases[i].says, err ? err : "");
    free(err);
  }
}

int th_proc_spawnl(struct th_proc *p, char *const env[], int capture, char *const *extra,
                   const char *prog, ...) {
  char *argv[TH_MAX_ARGS + 2];
  va_list ap;
  va_start(ap, prog);
  build_argv(argv, prog, ap, extra);
  va_end(ap);
  return th_proc_spawn(p, argv, env, capture);
}

void th_generate_ids(const char *model, const char *prompt, const char *max_tokens, char *ids,
                     size_t size) {
  struct th_out o = {0};
  TH_REQUIRE(th_lmserve(&o, 120000, "generate", "--model", model, "--prompt-ids", prompt,
                        "--max-tokens", max_tokens, NULL) == 0);
  const char *end = o.out[0] == '[' ? strchr(o.out, ']') : NULL;
  TH_REQUIRE(end && end > o.out + 1 && (size_t)(end - o.out - 1) < size);
  memcpy(ids, o.out + 1, (size_t)(end - o.out - 1));
  ids[end - o.out - 1] = 0;
  th_out_free(&o);
}

int th_generate(const char *model, const uint32_t *prompt, int n, int max_tokens, int timeout_ms,
                uint32_t *out) {
  char ids[4096] = "", mt[16];
  size_t len = 0;
  for (int i = 0; i < n && len < sizeof(ids); i++)
    len += (size_t)snprintf(ids + len, sizeof(ids) - len, "%s%u", i ? "," : "", prompt[i]);
  snprintf(mt, sizeof(mt), "%d", max_tokens);
  struct th_out o = {0};
  int rc = th_lmserve(&o, timeout_ms, "generate", "--model", model, "--prompt-ids", ids,
                      "--max-tokens", mt, "--ignore-eos", "--threads", "1", NULL);
  int k = -1;
  if (rc == 0 && o.out && o.out[0] == '[') {
    k = 0;
    char *p = o.out + 1;
    while (*p && *p != ']' && k < max_tokens) {
      char *end;
      unsigned long v = strtoul(p, &end, 10);
      if (end == p) break;
      out[k++] = (uint32_t)v;
      p = end;
      while (*p == ',' || *p == ' ')
        p++;
    }
  } else {
    fprintf(stderr, "generate: %d %s\n", rc, o.err ? o.err : "");
  }
  th_out_free(&o);
  return k;
}

int th_serve_start(struct th_proc *p, const char *model, char *const *extra) {
  return th_serve_start_env(p, model, NULL, extra);
}

int th_serve_start_env(struct th_proc *p, const char *model, char *const *more_env,
                       char *const *extra) {
  int port = th_free_port();
  if (port <= 0) return -1;
  char port_s[16];
  snprintf(port_s, sizeof(port_s), "%d", port);
  char *env[8] = {"LMSERVE_LOG=warn"};
  for (int i = 0; more_env && more_env[i]; i++) {
    if (i == 6) return -1; /* more than the table holds */
    env[1 + i] = more_env[i];
  }
  if (th_proc_spawnl(p, env, 1, extra, th_lmserve_bin(), "serve", "--port", port_s, "--model",
                     model, "--drain-timeout", "10", NULL))
    return -1;
  /* serve prints its URL line once the whole stack is ready */
  if (th_proc_wait_output(p, "lmserve: serving", 240000) != 0) {
    th_proc_stop(p, 2000);
    return -1;
  }
  return port;
}

/* ---- node ------------------------------------------------------------------- */

int th_node_major(void) {
  char *ver[] = {"node", "--version", NULL};
  char *out = NULL;
  int rc = th_run(ver, NULL, NULL, 0, 60000, &out, NULL);
  int major = rc == 0 && out && out[0] == 'v' ? atoi(out + 1) : 0;
  free(out);
  return major;
}

const char *th_require_numpy(const char *what, const char *script) {
  const char *env = getenv("LMSERVE_PYTHON");
  const char *cands[] = {env && *env ? env : "python3", "/usr/bin/python3"};
  int found = 0;
  for (size_t i = 0; i < CM_ARRAY_LEN(cands); i++) {
    char out[512];
    char *argv[] = {(char *)cands[i], "-c", "import numpy", NULL};
    int rc = cm_run_capture(argv, out, sizeof(out));
    if (rc == 0) return cands[i];
    if (rc != CM_ERR_NOENT) found = 1;
  }
  char why[512];
  snprintf(why, sizeof(why),
           "%s: %s is not checked against tests/reference/%s (install %s: "
           "tools/setup)",
           found ? "NO NUMPY" : "NO PYTHON3", what, script,
           found ? "python3-numpy" : "python3 and python3-numpy");
  TH_SKIP(why);
}

int th_reference_run(const char *python, const char *script, char *const *args, char *log,
                     size_t n) {
  char path[1024], *argv[24];
  snprintf(path, sizeof(path), "%s/reference/%s", th_tests_dir(), script);
  int k = 0;
  argv[k++] = (char *)python;
  argv[k++] = path;
  for (int i = 0; args && args[i]; i++) {
    TH_REQUIRE(k < 22); /* at most 20 arguments */
    argv[k++] = args[i];
  }
  argv[k] = NULL;
  return cm_run_capture(argv, log, n);
}

void th_reference_at(const char *file, int line, const char *python, const char *script,
                     char *const *args) {
  char log[8192] = "";
  int rc = th_reference_run(python, script, args, log, sizeof(log));
  if (rc) {
    th_fail(file, line, "tests/reference/%s exited with %d:\n%s", script, rc, log);
    th_stop();
  }
}

int th_npm_has(const char *name) {
  const char *src = getenv("TH_SOURCE_DIR");
  char pkg[1024];
  snprintf(pkg, sizeof(pkg), "%s/node_modules/%s/package.json", src ? src : ".", name);
  return access(pkg, R_OK) == 0;
}

void th_node_test(const char *script, char *const env[], int timeout_ms) {
  char *argv[] = {"node", "--test-reporter=spec", (char *)script, NULL};
  if (th_node_major() < 20) { /* no --test-reporter before node 18.15 */
    argv[1] = (char *)script;
    argv[2] = NULL;
  }
  struct th_proc node;
  TH_REQUIRE(th_proc_spawn(&node, argv, env, 0) == 0);
  TH_CHECK_EQ_INT(th_proc_wait(&node, timeout_ms), 0);
  TH_CHECK(node.exited && WIFEXITED(node.status));
  if (node.exited && WIFEXITED(node.status) && WEXITSTATUS(node.status) != 0)
    th_fail(__FILE__, __LINE__, "%s failed (exit %d)", script, WEXITSTATUS(node.status));
  th_proc_stop(&node, 1000);
}
