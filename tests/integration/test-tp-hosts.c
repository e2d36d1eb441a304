/* test-tp-hosts.c — roles on different hosts: the frontend, the scheduler
 * and the two ranks of a tensor-parallel group of size 2 each run in a
 * network namespace of their own (veths to a bridge in a further namespace,
 * addresses in a private /24 that exists only inside these namespaces), and
 * the test's client in one more; they talk over tcp:// only, while the ranks
 * still all-reduce through /dev/shm (every namespace shares the host's mount
 * of it) and learn the group's id from the scheduler's DIST. A greedy
 * completion served end to end must equal the same request served by
 * `lmserve serve` (size 1) on the same tiny model.
 *
 * Where namespaces cannot be made (no `ip` binary, not root, `ip netns add`
 * refused, no bridge), the roles run as plain processes on distinct loopback
 * addresses (127.0.0.2, 127.0.0.3, ...) instead, and the test says so on
 * stderr (TH_TP_HOSTS_LOOPBACK=1 picks that mode on purpose). Namespace
 * names hold the test's pid; a guard process (its own session, so it
 * outlives a killed test) deletes the links and namespaces once the test
 * ends, however it ends. Every wait is bounded. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-time.h"
#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

/* The hosts: the test's client (and the size-1 reference server), then one
 * per role. */
enum { H_CL, H_FE, H_SC, H_R0, H_R1, N_HOSTS };
static const char *const host_tag[N_HOSTS] = {"cl", "fe", "sc", "r0", "r1"};

/* The private /24 of the namespace mode; no route to it leaves them. */
#define NET_PREFIX "10.201.0"

#define MAX_TOK 8

static struct {
  int netns;               /* 1: network namespaces; 0: loopback addresses */
  char ip[64];             /* path of the ip binary */
  char sw[64];             /* the bridge's namespace */
  char ns[N_HOSTS][64];    /* each host's namespace */
  char addr[N_HOSTS][32];  /* each host's address */
  int http_port, ref_port; /* the frontend's, the reference server's */
  int fe_port, wk_port;    /* the scheduler's two endpoints */
  pid_t guard;             /* deletes the namespaces when the test ends */
  int guard_fd;            /* write end of its pipe; -1 when none */
} g = {.guard_fd = -1};


/* ---- running ip ------------------------------------------------------------ */

/* The ip binary, or NULL. */
static const char *find_ip(void) {
  static const char *const known[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (access(known[i], X_OK) == 0) return known[i];
  return NULL;
}

/* Splits a formatted command line at spaces into argv (at most n-1 words);
 * argv[0] is the ip binary. */
static void split(char *line, char **argv, int n) {
  int k = 0;
  argv[k++] = g.ip;
  for (char *s = strtok(line, " "); s && k < n - 1; s = strtok(NULL, " "))
    argv[k++] = s;
  argv[k] = NULL;
}

/* `ip ARGS` with a bound of 10 s; 0, else -1 with ip's complaint in why. */
__attribute__((format(printf, 3, 4))) static int ip(char *why, size_t whyn, const char *fmt, ...) {
  char line[512], *argv[24];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  char shown[512];
  snprintf(shown, sizeof shown, "%s", line);
  split(line, argv, 24);
  char *out = NULL, *err = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 10000, &out, &err);
  if (rc && why) snprintf(why, whyn, "'ip %s' failed (%d): %s", shown, rc, err && *err ? err : "");
  free(out);
  free(err);
  return rc ? -1 : 0;
}

/* The guard's ip: no harness, no output, a bound of 10 s. */
static void guard_ip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void guard_ip(const char *fmt, ...) {
  char line[512], *argv[24];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  split(line, argv, 24);
  pid_t pid = fork();
  if (pid < 0) return;
  if (pid == 0) {
    int dn = open("/dev/null", O_RDWR);
    if (dn >= 0) dup2(dn, 1), dup2(dn, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  for (int i = 0; i < 1000; i++) {
    if (waitpid(pid, NULL, WNOHANG) == pid) return;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* Deletes this run's links and namespaces (each may be missing). */
static void net_down(void) {
  for (int h = 0; h < N_HOSTS; h++)
    guard_ip("-n %s link del v%s", g.sw, host_tag[h]);
  guard_ip("-n %s link del br0", g.sw);
  for (int h = 0; h < N_HOSTS; h++)
    guard_ip("netns del %s", g.ns[h]);
  guard_ip("netns del %s", g.sw);
}

/* Forks the guard: in a session of its own, deaf to the signals that stop
 * the test, it waits for its pipe to close (the test finished or died) and
 * then tears the network down. 0 or -1. */
static int guard_start(void) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]), close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    setsid();
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGALRM, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
      signal(sigs[i], SIG_IGN);
    close(fds[1]);
    int dn = open("/dev/null", O_RDWR);
    if (dn >= 0) dup2(dn, 0), dup2(dn, 1);
    for (;;) {
      char c;
      ssize_t k = read(fds[0], &c, 1);
      if (k == 0 || (k < 0 && errno != EINTR)) break;
    }
    net_down();
    _exit(0); /* not exit: the test's atexit handlers are not the guard's */
  }
  close(fds[0]);
  g.guard = pid;
  g.guard_fd = fds[1];
  return 0;
}

/* Lets the guard tear down now and waits for it (30 s at most). 0 when it
 * finished. */
static int guard_finish(void) {
  if (g.guard_fd < 0) return 0;
  close(g.guard_fd);
  g.guard_fd = -1;
  for (int i = 0; i < 3000; i++) {
    if (waitpid(g.guard, NULL, WNOHANG) == g.guard) return 0;
    usleep(10000);
  }
  return -1;
}

/* Namespaces, a bridge and veths, one address each; 0, else -1 with the
 * reason in why (the caller tears down what was made). */
static int net_up(char *why, size_t whyn) {
  if (ip(why, whyn, "netns add %s", g.sw)) return -1;
  for (int h = 0; h < N_HOSTS; h++)
    if (ip(why, whyn, "netns add %s", g.ns[h])) return -1;
  if (ip(why, whyn, "-n %s link add br0 type bridge", g.sw) ||
      ip(why, whyn, "-n %s link set br0 up", g.sw))
    return -1;
  for (int h = 0; h < N_HOSTS; h++) {
    const char *t = host_tag[h];
    if (ip(why, whyn, "-n %s link add v%s type veth peer name eth0 netns %s", g.sw, t, g.ns[h]) ||
        ip(why, whyn, "-n %s link set v%s master br0", g.sw, t) ||
        ip(why, whyn, "-n %s link set v%s up", g.sw, t) ||
        ip(why, whyn, "-n %s link set lo up", g.ns[h]) ||
        ip(why, whyn, "-n %s addr add %s/24 dev eth0", g.ns[h], g.addr[h]) ||
        ip(why, whyn, "-n %s link set eth0 up", g.ns[h]))
      return -1;
  }
  return 0;
}

/* ---- hosts ------------------------------------------------------------------ */

/* A TCP port free on addr right now (another process may still take it), or
 * -1. Binds only; sends nothing. */
static int free_port_on(const char *addr) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t al = sizeof a;
  int port = -1;
  if (inet_pton(AF_INET, addr, &a.sin_addr) == 1 && bind(fd, (struct sockaddr *)&a, al) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &al) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* Picks the mode (namespaces when they can be made) and says which, loudly. */
static void choose_mode(void) {
  pid_t pid = getpid();
  snprintf(g.sw, sizeof g.sw, "lmtp%d-sw", (int)pid);
  for (int h = 0; h < N_HOSTS; h++)
    snprintf(g.ns[h], sizeof g.ns[h], "lmtp%d-%s", (int)pid, host_tag[h]);
  char why[1024] = "";
  const char *ipb = find_ip();
  const char *force = getenv("TH_TP_HOSTS_LOOPBACK");
  if (force && *force && strcmp(force, "0") != 0)
    snprintf(why, sizeof why, "TH_TP_HOSTS_LOOPBACK is set");
  else if (!ipb)
    snprintf(why, sizeof why, "no ip binary (install iproute2)");
  else if (geteuid() != 0)
    snprintf(why, sizeof why, "not root");
  else {
    snprintf(g.ip, sizeof g.ip, "%s", ipb);
    for (int h = 0; h < N_HOSTS; h++)
      snprintf(g.addr[h], sizeof g.addr[h], NET_PREFIX ".%d", h + 1);
    if (guard_start())
      snprintf(why, sizeof why, "cannot fork the clean-up guard: %s", strerror(errno));
    else if (net_up(why, sizeof why) == 0)
      g.netns = 1;
    else {
      guard_finish(); /* deletes what was made */
      why[strcspn(why, "\n")] = 0;
    }
  }
  if (g.netns) {
    /* each namespace has its ports to itself */
    g.http_port = 8000, g.ref_port = 8001, g.fe_port = 5555, g.wk_port = 5556;
    fprintf(stderr,
            "\n*** tp-hosts: MODE network namespaces: lmtp%d-{cl,fe,sc,r0,r1} at " NET_PREFIX
            ".1-5/24, bridged in %s ***\n\n",
            (int)pid, g.sw);
    return;
  }
  for (int h = 0; h < N_HOSTS; h++)
    snprintf(g.addr[h], sizeof g.addr[h], "127.0.0.%d", h + 2);
  g.ref_port = free_port_on(g.addr[H_CL]);
  g.http_port = free_port_on(g.addr[H_FE]);
  g.fe_port = free_port_on(g.addr[H_SC]);
  for (int i = 0; i < 20 && (g.wk_port = free_port_on(g.addr[H_SC])) == g.fe_port; i++) {
  }
  if (g.wk_port == g.fe_port) g.wk_port = -1;
  fprintf(stderr,
          "\n*** tp-hosts: MODE FALLBACK to loopback addresses 127.0.0.2-6 with plain processes "
          "(no network namespaces: %s) ***\n\n",
          why);
}

/* Starts `lmserve ARGS...` on host h (through `ip netns exec` in the
 * namespace mode). 0 or -1. */
static int spawn_on(int h, struct th_proc *p, char *const *args, int capture) {
  char *argv[48];
  int n = 0;
  if (g.netns) {
    argv[n++] = g.ip;
    argv[n++] = "netns";
    argv[n++] = "exec";
    argv[n++] = g.ns[h];
  }
  argv[n++] = th_lmserve_bin();
  for (int i = 0; args[i] && n < 47; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  return th_proc_spawn(p, argv, NULL, capture) ? -1 : 0;
}

/* A connection from the client's host to addr:port (5 s at most), or -1. */
static int client_connect(const char *addr, int port) {
  int orig = -1, ns = -1, fd = -1;
  if (g.netns) { /* the socket belongs to the namespace it was made in */
    char path[128];
    snprintf(path, sizeof path, "/run/netns/%s", g.ns[H_CL]);
    orig = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    ns = open(path, O_RDONLY | O_CLOEXEC);
    if (orig >= 0 && ns >= 0 && setns(ns, CLONE_NEWNET) == 0) {
      fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (setns(orig, CLONE_NEWNET)) {
        fprintf(stderr, "tp-hosts: cannot return to the test's namespace: %s\n", strerror(errno));
        abort();
      }
    }
    if (orig >= 0) close(orig);
    if (ns >= 0) close(ns);
  } else {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  int ok = inet_pton(AF_INET, addr, &a.sin_addr) == 1;
  if (ok && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    ok = errno == EINPROGRESS;
    struct pollfd pf = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t el = sizeof err;
    ok = ok && poll(&pf, 1, 5000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 &&
         err == 0;
  }
  if (!ok) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

/* One request from the client's host; the status (-1: none) and the body in
 * *out (malloc'd, always set). */
static int request(const char *addr, int port, const char *method, const char *path,
                   const char *body, int timeout_ms, char **out) {
  return th_http_on(client_connect(addr, port), method, path, body, timeout_ms, out);
}

/* Polls /health until 200 or timeout_s; the last status. */
static int wait_health(const char *addr, int port, int timeout_s) {
  double end = cm_time_s() + timeout_s;
  int st = -1;
  while (cm_time_s() < end) {
    char *b = NULL;
    st = request(addr, port, "GET", "/health", NULL, 5000, &b);
    free(b);
    if (st == 200) break;
    usleep(200000);
  }
  return st;
}

/* ---- the requests ------------------------------------------------------------ */

static const char *const bodies[] = {
    "{\"prompt\":\"The capital of France is\",\"max_tokens\":8,\"temperature\":0,"
    "\"ignore_eos\":true}",
    "{\"prompt\":[2,818,5279,563],\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}",
};
#define N_REQ (int)(sizeof bodies / sizeof bodies[0])

/* Sends every request to addr:port in turn; their texts in text[]. 0 or -1. */
static int ask(const char *who, const char *addr, int port, char text[][1024]) {
  for (int i = 0; i < N_REQ; i++) {
    char *b = NULL;
    int st = request(addr, port, "POST", "/v1/completions", bodies[i], 120000, &b);
    json_t *j = st == 200 ? json_loads(b, 0, NULL) : NULL;
    json_t *t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
    json_t *u = json_object_get(json_object_get(j, "usage"), "completion_tokens");
    int ok = json_is_string(t) && json_integer_value(u) == MAX_TOK;
    if (ok)
      snprintf(text[i], 1024, "%s", json_string_value(t));
    else
      fprintf(stderr, "tp-hosts: %s, request %d: HTTP %d: %.300s\n", who, i, st, b ? b : "");
    json_decref(j);
    free(b);
    if (!ok) return -1;
  }
  return 0;
}

/* The inode of a process's network namespace, or 0. */
static unsigned long net_ns_of(pid_t pid) {
  char path[64];
  struct stat st;
  snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
  return stat(path, &st) == 0 ? (unsigned long)st.st_ino : 0;
}

TH_TEST(tp_group_across_hosts_matches_serve) {
  double t0 = cm_time_s();
  th_proc_init(840);
  char tmp[256], model[320];
  TH_REQUIRE(th_tmpdir("tp-hosts", tmp, sizeof tmp) == 0);
  int mk = th_tiny_gemma4(tmp, 5, model, sizeof model);
  TH_REQUIRE(mk >= 0);
  if (mk) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  choose_mode();
  TH_REQUIRE(g.http_port > 0 && g.ref_port > 0 && g.fe_port > 0 && g.wk_port > 0);

  /* the reference: `lmserve serve` at size 1 on the client's host */
  char ref_port[16], http_port[16], fe_ep[64], wk_ep[64];
  snprintf(ref_port, sizeof ref_port, "%d", g.ref_port);
  snprintf(http_port, sizeof http_port, "%d", g.http_port);
  snprintf(fe_ep, sizeof fe_ep, "tcp://%s:%d", g.addr[H_SC], g.fe_port);
  snprintf(wk_ep, sizeof wk_ep, "tcp://%s:%d", g.addr[H_SC], g.wk_port);
  char want[N_REQ][1024], got[N_REQ][1024];
  {
    /* clang-format off */
    char *sv[] = {"serve", "--model", model, "--host", g.addr[H_CL], "--port", ref_port,
                  "--tensor-parallel-size", "1", "--threads", "1", "--kv-cache-memory", "64M",
                  "--drain-timeout", "5", NULL};
    /* clang-format on */
    struct th_proc ps;
    TH_REQUIRE(spawn_on(H_CL, &ps, sv, 1) == 0);
    int up = th_proc_wait_output(&ps, "lmserve: serving", 180000) == 0 &&
             wait_health(g.addr[H_CL], g.ref_port, 60) == 200;
    int rc = up ? ask("serve", g.addr[H_CL], g.ref_port, want) : -1;
    th_proc_signal(&ps, SIGTERM);
    TH_CHECK_EQ_INT(th_proc_wait(&ps, 30000), 0);
    th_proc_stop(&ps, 1000);
    TH_REQUIRE(up);
    TH_REQUIRE(rc == 0);
  }
  double t_ref = cm_time_s();

  /* the roles, each on its own host: the scheduler, both ranks, the frontend */
  struct th_proc pr[N_HOSTS];
  memset(pr, 0, sizeof pr);
  /* clang-format off */
  char *sc[] = {"scheduler", "--model", model, "--frontend-endpoint", fe_ep,
                "--worker-endpoint", wk_ep, "--world-size", "2", NULL};
  char *r0[] = {"worker", "--model", model, "--scheduler", wk_ep, "--rank", "0",
                "--world-size", "2", "--threads", "1", "--kv-cache-memory", "64M", NULL};
  char *r1[] = {"worker", "--model", model, "--scheduler", wk_ep, "--rank", "1",
                "--world-size", "2", "--threads", "1", "--kv-cache-memory", "64M", NULL};
  char *fe[] = {"frontend", "--model", model, "--scheduler", fe_ep, "--host", g.addr[H_FE],
                "--port", http_port, "--drain-timeout", "5", NULL};
  /* clang-format on */
  TH_REQUIRE(spawn_on(H_SC, &pr[H_SC], sc, 0) == 0);
  TH_REQUIRE(spawn_on(H_R0, &pr[H_R0], r0, 0) == 0);
  TH_REQUIRE(spawn_on(H_R1, &pr[H_R1], r1, 0) == 0);
  TH_REQUIRE(spawn_on(H_FE, &pr[H_FE], fe, 1) == 0);
  TH_REQUIRE(th_proc_wait_output(&pr[H_FE], "listening on", 60000) == 0);
  int st = wait_health(g.addr[H_FE], g.http_port, 300);
  TH_CHECK_EQ_INT(st, 200);

  if (g.netns) { /* each role really sits in a network namespace of its own */
    unsigned long mine = net_ns_of(getpid());
    for (int h = H_FE; h < N_HOSTS; h++) {
      unsigned long ns = net_ns_of(pr[h].pid);
      TH_CHECK(ns != 0 && ns != mine);
      for (int k = H_FE; k < h; k++)
        TH_CHECK(ns != net_ns_of(pr[k].pid));
    }
  }

  /* greedy across the hosts == serve at size 1 */
  if (st == 200 && ask("cluster", g.addr[H_FE], g.http_port, got) == 0)
    for (int i = 0; i < N_REQ; i++) {
      fprintf(stderr, "tp-hosts: request %d: \"%s\"\n", i, got[i]);
      TH_CHECK_EQ_STR(got[i], want[i]);
    }
  else
    th_fail(__FILE__, __LINE__, "the cluster did not answer");
  double t_cluster = cm_time_s();

  /* each role stops on SIGTERM by itself */
  static const int order[] = {H_FE, H_SC, H_R0, H_R1};
  for (int i = 0; i < 4; i++) {
    struct th_proc *p = &pr[order[i]];
    th_proc_signal(p, SIGTERM);
    if (th_proc_wait(p, 30000))
      th_fail(__FILE__, __LINE__, "%s did not stop within 30 s", host_tag[order[i]]);
    th_proc_stop(p, 1000);
  }

  /* the network is gone */
  if (g.netns) {
    TH_CHECK_EQ_INT(guard_finish(), 0);
    for (int h = 0; h <= N_HOSTS; h++) {
      char path[128];
      snprintf(path, sizeof path, "/run/netns/%s", h < N_HOSTS ? g.ns[h] : g.sw);
      if (access(path, F_OK) == 0) th_fail(__FILE__, __LINE__, "%s is still there", path);
    }
  }
  fprintf(stderr, "tp-hosts: %s mode: reference %.1f s, cluster %.1f s, total %.1f s\n",
          g.netns ? "namespace" : "loopback", t_ref - t0, t_cluster - t_ref, cm_time_s() - t0);
}
