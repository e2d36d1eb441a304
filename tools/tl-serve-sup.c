/* tl-serve-sup.c — `lmserve serve`'s children and their supervision (see the
 * top of tl-serve.c for what happens when a role dies or hangs). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-assert.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "common/cm-time.h"
#include "tools/tl-serve-impl.h"

/* ---- children ------------------------------------------------------------ */

/* Starts `lmserve ARGS` as role (of replica engine, rank) in that role's slot (a
 * new slot the first time; a restart reuses it). */
int tl_srv_spawn(struct tl_serve *s, const char *role, int engine, int rank, struct tl_argv *a) {
  struct tl_child *c = NULL;
  for (int i = 0; i < s->n_children && !c; i++)
    if (!strcmp(s->children[i].role, role) && s->children[i].engine == engine &&
        s->children[i].rank == rank)
      c = &s->children[i];
  CM_ASSERT(!c || c->pid <= 0);
  if (!c && s->n_children >= TL_MAX_CHILDREN) return CM_ERR_FULL;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return CM_ERR_IO;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    signal(SIGINT, SIG_IGN); /* the supervisor decides the order of shutdown */
    signal(SIGTERM, SIG_DFL);
    execv(tl_srv_self_exe(), a->v);
    fprintf(stderr, "lmserve serve: cannot run %s: %s\n", tl_srv_self_exe(), strerror(errno));
    _exit(127);
  }
  if (!c) c = &s->children[s->n_children++];
  c->role = role;
  c->engine = engine;
  c->rank = rank;
  c->pid = pid;
  char name[96];
  cm_info("serve", "started %s", tl_srv_child_name(c, name, sizeof(name)));
  return 0;
}

/* How a reaped child ended, as "exited with status 1" or "killed by signal 9 (Killed)". */
const char *tl_srv_exit_text(const struct tl_child *c, char *buf, size_t len) {
  if (WIFEXITED(c->status))
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(c->status));
  else if (WIFSIGNALED(c->status))
    snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(c->status),
             strsignal(WTERMSIG(c->status)));
  else
    snprintf(buf, len, "ended (wait status %d)", c->status);
  return buf;
}

/* A child's name for messages: "worker rank 1 (pid 123)", "scheduler (pid 124)",
 * "scheduler of replica 1 (pid 125)" (replicas past the first are named). */
const char *tl_srv_child_name(const struct tl_child *c, char *buf, size_t len) {
  int pid = c->pid < 0 ? -c->pid : c->pid;
  char of[32] = "";
  if (c->engine > 0) snprintf(of, sizeof(of), " of replica %d", c->engine);
  if (c->rank >= 0)
    snprintf(buf, len, "%s rank %d%s (pid %d)", c->role, c->rank, of, pid);
  else
    snprintf(buf, len, "%s%s (pid %d)", c->role, of, pid);
  return buf;
}

/* Reaps one exited child: the newly dead one, or NULL when none has exited. */
struct tl_child *tl_srv_reap(struct tl_serve *s) {
  for (int i = 0; i < s->n_children; i++) {
    struct tl_child *c = &s->children[i];
    if (c->pid <= 0) continue;
    int st;
    pid_t r = waitpid(c->pid, &st, WNOHANG);
    if (r == c->pid) {
      c->status = st;
      c->pid = -c->pid; /* keep the number for messages, mark reaped */
      return c;
    }
  }
  return NULL;
}

static void reap_all(struct tl_serve *s) {
  while (tl_srv_reap(s)) {
  }
}

/* Whether c is a live `role` of replica engine (-1: of any). */
static int is(const struct tl_child *c, int engine, const char *role) {
  return c->pid > 0 && (engine < 0 || c->engine == engine) && !strcmp(c->role, role);
}

static int n_alive(const struct tl_serve *s, int engine, const char *role) {
  int n = 0;
  for (int i = 0; i < s->n_children; i++)
    n += is(&s->children[i], engine, role);
  return n;
}

static void signal_role(struct tl_serve *s, int engine, const char *role, int sig) {
  for (int i = 0; i < s->n_children; i++)
    if (is(&s->children[i], engine, role)) kill(s->children[i].pid, sig);
}

static void wait_role(struct tl_serve *s, const char *role, double timeout_s) {
  double end = cm_time_s() + timeout_s;
  while (n_alive(s, -1, role) > 0 && cm_time_s() < end) {
    reap_all(s);
    cm_time_sleep_ns(20 * 1000 * 1000);
  }
}

/* Frontend first (it drains), then the scheduler, then the workers. */
void tl_srv_stop_all(struct tl_serve *s) {
  static const char *order[] = {"frontend", "scheduler", "worker"};
  for (size_t i = 0; i < CM_ARRAY_LEN(order); i++) {
    double grace = i == 0 ? (double)s->drain_timeout_s + 2.0 : 5.0;
    signal_role(s, -1, order[i], SIGTERM);
    wait_role(s, order[i], grace);
    if (n_alive(s, -1, order[i]) > 0) {
      cm_warn("serve", "%s did not stop in %.0f s; killing it", order[i], grace);
      signal_role(s, -1, order[i], SIGKILL);
      wait_role(s, order[i], 5.0);
    }
  }
}

/* ---- supervision ------------------------------------------------------------ */

#define TL_PING_S        0.2  /* PING period to the scheduler */
#define TL_FIRST_PONG_S  10.0 /* a fresh scheduler answers its first PING within this */
#define TL_HEALTHY_S     60.0 /* serving this long resets the back-off */
#define TL_BACKOFF_MIN_S 0.5
#define TL_BACKOFF_MAX_S 30.0

/* The scheduler's silence after which it counts as hung: seconds. */
static double sched_timeout(const struct tl_serve *s) {
  return s->beat_s * (double)s->beat_limit;
}

/* A fresh control socket to replica e's scheduler (one per scheduler process, so
 * that nothing queued for the old one reaches the new). */
int tl_srv_ctl_open(struct tl_serve *s, struct tl_engine *e) {
  pr_sock_close(e->ctl);
  e->ctl = NULL;
  int rc = pr_sock_open(s->zctx, ZMQ_DEALER, 0, &e->ctl);
  if (!rc) rc = pr_sock_connect(e->ctl, e->ep_front);
  if (rc)
    cm_error("serve", "cannot connect to the scheduler at %s: %s", e->ep_front, cm_strerror(rc));
  e->min_nonce = e->ping_nonce + 1;
  e->last_pong_t = cm_time_s() + TL_FIRST_PONG_S - sched_timeout(s);
  return rc;
}

static void ctl_ping(struct tl_engine *e) {
  struct pr_msg m;
  pr_msg_init(&m, PR_PING);
  m.u.ping.nonce = ++e->ping_nonce;
  m.u.ping.send_ns = cm_time_wall_ns();
  e->last_ping_t = cm_time_s();
  int rc = e->ctl ? pr_sock_send(e->ctl, NULL, &m, PR_DONTWAIT) : CM_ERR_CLOSED;
  if (rc && rc != CM_ERR_AGAIN) cm_debug("serve", "PING: %s", cm_strerror(rc));
}

/* Tells replica e's scheduler that its worker c's process has ended. */
static void ctl_down(struct tl_engine *e, const struct tl_child *c) {
  char how[128];
  struct pr_msg m;
  pr_msg_init(&m, PR_DOWN);
  m.u.down.rank = (uint32_t)c->rank;
  m.u.down.pid = (uint32_t)(c->pid < 0 ? -c->pid : c->pid);
  m.u.down.message = tl_srv_exit_text(c, how, sizeof(how));
  int rc = e->ctl ? pr_sock_send(e->ctl, NULL, &m, PR_DONTWAIT) : CM_ERR_CLOSED;
  if (rc) cm_debug("serve", "DOWN: %s", cm_strerror(rc));
}

static struct tl_child *find_child(struct tl_serve *s, int engine, const char *role) {
  for (int i = 0; i < s->n_children; i++)
    if (s->children[i].engine == engine && !strcmp(s->children[i].role, role))
      return &s->children[i];
  return NULL;
}

/* "the engine" or "replica 1" in messages. */
static const char *engine_name(const struct tl_serve *s, const struct tl_engine *e, char *buf,
                               size_t len) {
  if (s->dp > 1)
    snprintf(buf, len, "replica %d", e->index);
  else
    snprintf(buf, len, "the engine");
  return buf;
}

/* Replica e failed: its processes are killed (the workers; with_sched: the scheduler
 * too) and start again after the back-off. Returns 1 when serve must give up. */
static int engine_fail(struct tl_serve *s, struct tl_engine *e, int with_sched, const char *why) {
  double now = cm_time_s();
  char en[32];
  engine_name(s, e, en, sizeof(en));
  if (e->phase == TL_BACKOFF) { /* failing already: a scheduler death widens the restart */
    if (with_sched && !e->restart_sched) {
      cm_error("serve", "%s", why);
      e->restart_sched = 1;
      signal_role(s, e->index, "scheduler", SIGKILL);
    }
    return 0;
  }
  snprintf(e->last_failure, sizeof(e->last_failure), "%s", why);
  int starting = e->phase == TL_STARTING;
  if (starting) e->start_failures++;
  if (starting)
    cm_error("serve", "%s (before %s was ready)", why, en);
  else
    cm_error("serve", "%s", why);
  signal_role(s, e->index, "worker", SIGKILL); /* a group restarts whole */
  if (with_sched) signal_role(s, e->index, "scheduler", SIGKILL);
  if (e->start_failures >= s->max_start_failures) {
    cm_error("serve",
             "%s failed %d times in a row before it was ready (last: %s); giving up "
             "(--max-start-failures %lld)",
             en, e->start_failures, e->last_failure, (long long)s->max_start_failures);
    return 1;
  }
  e->phase = TL_BACKOFF;
  e->phase_t = now;
  e->restart_sched = with_sched;
  e->restart_at = now + e->backoff_s;
  cm_warn("serve", "restarting the %s%s%s in %.1f s",
          with_sched ? "scheduler and its workers" : "workers", s->dp > 1 ? " of " : "",
          s->dp > 1 ? en : "", e->backoff_s);
  e->backoff_s = CM_MIN(e->backoff_s * 2, TL_BACKOFF_MAX_S);
  return 0;
}

/* TL_BACKOFF: once the back-off has passed and replica e's old processes are gone,
 * starts it again. Returns 1 when serve must give up. */
static int engine_restart(struct tl_serve *s, struct tl_engine *e) {
  double now = cm_time_s();
  if (now < e->restart_at || n_alive(s, e->index, "worker") > 0 ||
      (e->restart_sched && n_alive(s, e->index, "scheduler") > 0))
    return 0;
  if (e->restart_sched) {
    if (tl_srv_start_scheduler(s, e) || tl_srv_ctl_open(s, e)) return 1;
  }
  if (tl_srv_start_workers(s, e)) return 1;
  e->phase = TL_STARTING;
  e->phase_t = now;
  e->min_nonce = e->ping_nonce + 1;
  return 0;
}

static void on_pong(struct tl_serve *s, struct tl_engine *e, const struct pr_pong *p) {
  if (p->nonce < e->min_nonce) return;
  e->last_pong_t = cm_time_s();
  int whole = p->world_size > 0 && p->workers_ready == p->world_size;
  char en[32];
  if (e->phase == TL_STARTING && whole) {
    cm_info("serve", "%s is ready", engine_name(s, e, en, sizeof(en)));
    e->phase = TL_UP;
    e->phase_t = e->last_pong_t;
    e->start_failures = 0;
  } else if (e->phase == TL_UP && !whole) {
    char why[192];
    snprintf(why, sizeof(why),
             "the scheduler of %s reports %u of %u worker ranks ready (a rank failed or "
             "stopped answering)",
             engine_name(s, e, en, sizeof(en)), p->workers_ready, p->world_size);
    e->min_nonce = e->ping_nonce + 1;
    (void)engine_fail(s, e, 0, why);
  }
}

static void ctl_recv(struct tl_serve *s, struct tl_engine *e) {
  for (;;) {
    struct pr_msg m;
    cm_arena_reset(&s->ctl_arena);
    int rc = e->ctl ? pr_sock_recv(e->ctl, NULL, &m, &s->ctl_arena, PR_DONTWAIT) : CM_ERR_AGAIN;
    if (rc == CM_ERR_AGAIN || rc == CM_ERR_CLOSED) return;
    if (rc == 0 && m.type == PR_PONG) on_pong(s, e, &m.u.pong);
  }
}

/* One replica's timers: its restart, PINGs, a silent scheduler, a slow start, a
 * back-off reset after a minute of health. Returns 1 when serve must give up. */
static int engine_tend(struct tl_serve *s, struct tl_engine *e) {
  double now = cm_time_s();
  if (e->phase == TL_BACKOFF) {
    if (engine_restart(s, e)) return 1;
    now = cm_time_s();
  }
  if (now - e->last_ping_t >= TL_PING_S) ctl_ping(e);
  if (e->phase != TL_BACKOFF && now - e->last_pong_t > sched_timeout(s)) {
    struct tl_child *sc = find_child(s, e->index, "scheduler");
    char why[160];
    snprintf(why, sizeof(why), "the scheduler (pid %d) has not answered for %.1f s; killing it",
             sc ? (sc->pid < 0 ? -sc->pid : sc->pid) : 0, now - e->last_pong_t);
    if (engine_fail(s, e, 1, why)) return 1;
  }
  if (e->phase == TL_STARTING && now - e->phase_t > (double)s->ready_timeout_s) {
    char why[128];
    snprintf(why, sizeof(why), "the engine was not ready %lld s after it started",
             (long long)s->ready_timeout_s);
    if (engine_fail(s, e, 1, why)) return 1;
  }
  if (e->phase == TL_UP && now - e->phase_t >= TL_HEALTHY_S) e->backoff_s = TL_BACKOFF_MIN_S;
  return 0;
}

/* Serves until a stop signal or a failure that ends serve; returns the exit code. */
int tl_srv_supervise(struct tl_serve *s) {
  int n = (int)s->dp;
  for (int i = 0; i < n; i++) {
    /* up at its first PONG with every rank ready: serving answers once one replica
     * is, and another may still be loading (not failed) */
    s->eng[i].phase = TL_STARTING;
    s->eng[i].phase_t = cm_time_s();
    s->eng[i].backoff_s = TL_BACKOFF_MIN_S;
  }
  while (!tl_serve_stop_signal) {
    zmq_pollitem_t it[TL_MAX_DP];
    int n_it = 0;
    for (int i = 0; i < n; i++)
      if (s->eng[i].ctl)
        it[n_it++] = (zmq_pollitem_t){pr_sock_zmq(s->eng[i].ctl), 0, ZMQ_POLLIN, 0};
    if (zmq_poll(it, n_it, 50) < 0 && zmq_errno() != EINTR) cm_time_sleep_ns(50000000);
    for (int i = 0; i < n; i++)
      ctl_recv(s, &s->eng[i]);
    struct tl_child *dead;
    while ((dead = tl_srv_reap(s))) {
      char name[96], how[128], why[256];
      tl_srv_child_name(dead, name, sizeof(name));
      tl_srv_exit_text(dead, how, sizeof(how));
      if (tl_serve_stop_signal) continue;
      if (!strcmp(dead->role, "frontend")) {
        cm_error("serve", "%s %s: the frontend is gone; stopping", name, how);
        return 1;
      }
      struct tl_engine *e = &s->eng[dead->engine >= 0 && dead->engine < n ? dead->engine : 0];
      int is_sched = !strcmp(dead->role, "scheduler");
      if (!is_sched) ctl_down(e, dead);
      /* the processes serve killed itself are expected to go */
      if (e->phase == TL_BACKOFF && (!is_sched || e->restart_sched)) {
        cm_info("serve", "%s %s", name, how);
        continue;
      }
      snprintf(why, sizeof(why), "%s %s", name, how);
      if (engine_fail(s, e, is_sched, why)) return 1;
    }
    for (int i = 0; i < n; i++)
      if (engine_tend(s, &s->eng[i])) return 1;
  }
  return 0;
}
