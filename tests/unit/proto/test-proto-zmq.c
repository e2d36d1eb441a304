/* test-proto-zmq.c — the ZeroMQ helpers: DEALER/ROUTER round trips over ipc
 * (in a fresh runtime directory) and inproc, replies by routing id, refusal
 * of malformed multipart messages without losing the stream, ROUTER_MANDATORY,
 * socket options, and endpoint naming. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "proto/pr-zmq.h"
#include "tests/harness/th.h"
#include "tests/unit/proto/pr-samples.h"

struct pair {
  void *ctx;
  struct pr_sock *router, *dealer;
};

static void pair_open(struct pair *p, const char *endpoint) {
  memset(p, 0, sizeof(*p));
  p->ctx = zmq_ctx_new();
  TH_REQUIRE(p->ctx != NULL);
  TH_REQUIRE(pr_sock_open(p->ctx, ZMQ_ROUTER, 0, &p->router) == 0);
  TH_REQUIRE(pr_sock_open(p->ctx, ZMQ_DEALER, 1u << 20, &p->dealer) == 0);
  TH_REQUIRE(pr_sock_set_timeouts(p->router, 5000, 5000) == 0);
  TH_REQUIRE(pr_sock_set_timeouts(p->dealer, 5000, 5000) == 0);
  TH_REQUIRE(pr_sock_set_rid(p->dealer, "fe-1", 4) == 0);
  TH_REQUIRE(pr_sock_bind(p->router, endpoint) == 0);
  TH_REQUIRE(pr_sock_connect(p->dealer, endpoint) == 0);
}

static void pair_close(struct pair *p) {
  pr_sock_close(p->dealer);
  pr_sock_close(p->router);
  zmq_ctx_term(p->ctx);
}

/* Every sample goes dealer -> router and back, decoded equal both ways. */
static void roundtrip_all(struct pair *p) {
  struct cm_arena a;
  cm_arena_init(&a, 4096, 8u << 20);
  for (int i = 0; i < prs_count(); i++) {
    struct pr_msg m, got;
    struct pr_rid from;
    const char *name;
    prs_build(i, &m, &name);
    TH_CHECK_EQ_INT(pr_sock_send(p->dealer, NULL, &m, 0), 0);
    memset(&from, 0, sizeof(from));
    int rc = pr_sock_recv(p->router, &from, &got, &a, 0);
    if (rc) th_fail(__FILE__, __LINE__, "%s: router recv: %s", name, cm_strerror(rc));
    TH_CHECK(rc == 0 && pr_msg_equal(&m, &got));
    TH_CHECK(from.len == 4 && memcmp(from.id, "fe-1", 4) == 0);
    cm_arena_reset(&a);
    TH_CHECK_EQ_INT(pr_sock_send(p->router, &from, &m, 0), 0);
    rc = pr_sock_recv(p->dealer, NULL, &got, &a, 0);
    if (rc) th_fail(__FILE__, __LINE__, "%s: dealer recv: %s", name, cm_strerror(rc));
    TH_CHECK(rc == 0 && pr_msg_equal(&m, &got));
    cm_arena_reset(&a);
  }
  cm_arena_free(&a);
}

TH_TEST(dealer_router_ipc) {
  char base[] = "/tmp/lmserve-proto-test-XXXXXX";
  TH_REQUIRE(mkdtemp(base) != NULL);
  char dir[256], sub[300], ep[300];
  snprintf(sub, sizeof(sub), "%s/run/x", base);
  TH_REQUIRE(pr_runtime_dir(sub, dir, sizeof(dir)) == 0);
  TH_CHECK_EQ_STR(dir, sub);
  struct stat st;
  TH_REQUIRE(stat(dir, &st) == 0);
  TH_CHECK_EQ_INT(st.st_mode & 0777, 0700);
  TH_REQUIRE(pr_endpoint(dir, "scheduler", ep, sizeof(ep)) == 0);
  struct pair p;
  pair_open(&p, ep);
  roundtrip_all(&p);
  pair_close(&p);
  char path[400];
  snprintf(path, sizeof(path), "%s/scheduler.sock", dir);
  unlink(path);
  rmdir(dir);
  snprintf(path, sizeof(path), "%s/run", base);
  rmdir(path);
  rmdir(base);
}

TH_TEST(dealer_router_inproc) {
  struct pair p;
  pair_open(&p, "inproc://proto-test");
  roundtrip_all(&p);
  pair_close(&p);
}

/* Bad multipart messages are refused whole, and the next good one arrives. */
TH_TEST(malformed_frames_refused) {
  struct pair p;
  pair_open(&p, "inproc://proto-bad");
  void *d = pr_sock_zmq(p.dealer);
  const uint8_t hdr_ok[2] = {PR_PING, PR_VERSION};
  const uint8_t hdr_ver[2] = {PR_PING, PR_VERSION + 1};
  const uint8_t hdr_type[2] = {200, PR_VERSION};
  const uint8_t body[] = {0x81, 0x00, 0x05}; /* {nonce: 5} */
  const uint8_t five[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
  /* one frame only */
  TH_REQUIRE(zmq_send(d, hdr_ok, 2, 0) == 2);
  /* four frames */
  TH_REQUIRE(zmq_send(d, hdr_ok, 2, ZMQ_SNDMORE) == 2);
  TH_REQUIRE(zmq_send(d, body, 3, ZMQ_SNDMORE) == 3);
  TH_REQUIRE(zmq_send(d, body, 3, ZMQ_SNDMORE) == 3);
  TH_REQUIRE(zmq_send(d, body, 3, 0) == 3);
  /* wrong version, unknown type, hostile body */
  TH_REQUIRE(zmq_send(d, hdr_ver, 2, ZMQ_SNDMORE) == 2);
  TH_REQUIRE(zmq_send(d, body, 3, 0) == 3);
  TH_REQUIRE(zmq_send(d, hdr_type, 2, ZMQ_SNDMORE) == 2);
  TH_REQUIRE(zmq_send(d, body, 3, 0) == 3);
  TH_REQUIRE(zmq_send(d, hdr_ok, 2, ZMQ_SNDMORE) == 2);
  TH_REQUIRE(zmq_send(d, five, 5, 0) == 5);
  /* and a good one */
  TH_REQUIRE(zmq_send(d, hdr_ok, 2, ZMQ_SNDMORE) == 2);
  TH_REQUIRE(zmq_send(d, body, 3, 0) == 3);

  struct cm_arena a;
  cm_arena_init(&a, 1024, 1u << 16);
  struct pr_msg m;
  struct pr_rid from;
  const int want[] = {CM_ERR_PARSE, CM_ERR_PARSE, CM_ERR_VERSION, CM_ERR_UNKNOWN, CM_ERR_PARSE, 0};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    from.len = 0;
    int rc = pr_sock_recv(p.router, &from, &m, &a, 0);
    TH_CHECK_EQ_INT(rc, want[i]);
    TH_CHECK(from.len == 4); /* the sender is known even for refused messages */
    cm_arena_reset(&a);
  }
  TH_CHECK(m.type == PR_PING && m.u.ping.nonce == 5);
  /* nothing left */
  TH_CHECK_EQ_INT(pr_sock_recv(p.router, &from, &m, &a, PR_DONTWAIT), CM_ERR_AGAIN);
  cm_arena_free(&a);
  pair_close(&p);
}

TH_TEST(router_mandatory_and_options) {
  struct pair p;
  pair_open(&p, "inproc://proto-opts");
  struct pr_msg m;
  pr_msg_init(&m, PR_PING);
  struct pr_rid nobody = {.len = 3, .id = {'x', 'y', 'z'}};
  TH_CHECK_EQ_INT(pr_sock_send(p.router, &nobody, &m, 0), CM_ERR_CLOSED);
  TH_CHECK_EQ_INT(pr_sock_send(p.router, NULL, &m, 0), CM_ERR_INVAL);
  int64_t maxsz = 0;
  int linger = -1;
  size_t len = sizeof(maxsz);
  TH_CHECK_EQ_INT(zmq_getsockopt(pr_sock_zmq(p.dealer), ZMQ_MAXMSGSIZE, &maxsz, &len), 0);
  TH_CHECK(maxsz == (1 << 20));
  len = sizeof(linger);
  TH_CHECK_EQ_INT(zmq_getsockopt(pr_sock_zmq(p.router), ZMQ_LINGER, &linger, &len), 0);
  TH_CHECK_EQ_INT(linger, 0);
  len = sizeof(maxsz);
  TH_CHECK_EQ_INT(zmq_getsockopt(pr_sock_zmq(p.router), ZMQ_MAXMSGSIZE, &maxsz, &len), 0);
  TH_CHECK(maxsz == PR_MAX_MSG_DEFAULT);
  int fd = -1, ev = 0;
  TH_CHECK_EQ_INT(pr_sock_fd(p.dealer, &fd), 0);
  TH_CHECK(fd >= 0);
  TH_CHECK_EQ_INT(pr_sock_events(p.dealer, &ev), 0);
  TH_CHECK(!(ev & ZMQ_POLLIN));
  /* a message larger than the dealer's encode cap is refused before sending */
  static uint32_t toks[300000];
  pr_msg_init(&m, PR_ADD);
  m.u.add.request_id = 1;
  m.u.add.max_tokens = 1;
  m.u.add.prompt = (struct pr_u32s){toks, 300000};
  for (int i = 0; i < 300000; i++)
    toks[i] = 100000;
  TH_CHECK_EQ_INT(pr_sock_send(p.dealer, NULL, &m, 0), CM_ERR_TOOBIG);
  TH_CHECK_EQ_INT(pr_sock_set_rid(p.dealer, "", 0), CM_ERR_INVAL);
  pair_close(&p);
  /* zmq errors map to our codes */
  TH_CHECK_EQ_INT(pr_zmq_err(EAGAIN), CM_ERR_AGAIN);
  TH_CHECK_EQ_INT(pr_zmq_err(ETERM), CM_ERR_CLOSED);
  TH_CHECK_EQ_INT(pr_zmq_err(EHOSTUNREACH), CM_ERR_CLOSED);
  TH_CHECK_EQ_INT(pr_zmq_err(EMSGSIZE), CM_ERR_TOOBIG);
  TH_CHECK_EQ_INT(pr_zmq_err(EADDRINUSE), CM_ERR_IO);
}

TH_TEST(endpoint_naming) {
  char ep[256];
  TH_CHECK_EQ_INT(pr_endpoint(NULL, "tcp://10.0.0.2:5555", ep, sizeof(ep)), 0);
  TH_CHECK_EQ_STR(ep, "tcp://10.0.0.2:5555");
  TH_CHECK_EQ_INT(pr_endpoint(NULL, "inproc://x", ep, sizeof(ep)), 0);
  TH_CHECK_EQ_INT(pr_endpoint("/run/l", "worker-0", ep, sizeof(ep)), 0);
  TH_CHECK_EQ_STR(ep, "ipc:///run/l/worker-0.sock");
  TH_CHECK_EQ_INT(pr_endpoint(NULL, "worker-0", ep, sizeof(ep)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(pr_endpoint("/run/l", "../etc", ep, sizeof(ep)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(pr_endpoint("/run/l", "a/b", ep, sizeof(ep)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(pr_endpoint("/run/l", "", ep, sizeof(ep)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(pr_endpoint("/run/l", "host:1", ep, sizeof(ep)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(pr_endpoint("/run/l", "worker-0", ep, 10), CM_ERR_TOOBIG);
  char longdir[200];
  memset(longdir, 'd', sizeof(longdir) - 1);
  longdir[0] = '/';
  longdir[sizeof(longdir) - 1] = 0;
  TH_CHECK_EQ_INT(pr_endpoint(longdir, "w", ep, sizeof(ep)), CM_ERR_TOOBIG);
  /* runtime directory: refuses a file, fixes loose modes, honours the env */
  char base[] = "/tmp/lmserve-proto-ep-XXXXXX";
  TH_REQUIRE(mkdtemp(base) != NULL);
  char file[300], dir[300], out[300];
  snprintf(file, sizeof(file), "%s/file", base);
  FILE *f = fopen(file, "w");
  TH_REQUIRE(f != NULL);
  fclose(f);
  TH_CHECK_EQ_INT(pr_runtime_dir(file, out, sizeof(out)), CM_ERR_INVAL);
  snprintf(dir, sizeof(dir), "%s/loose", base);
  TH_REQUIRE(mkdir(dir, 0755) == 0);
  TH_CHECK_EQ_INT(pr_runtime_dir(dir, out, sizeof(out)), 0);
  struct stat st;
  TH_REQUIRE(stat(dir, &st) == 0);
  TH_CHECK_EQ_INT(st.st_mode & 0777, 0700);
  TH_CHECK_EQ_INT(pr_runtime_dir("relative/dir", out, sizeof(out)), CM_ERR_INVAL);
  TH_CHECK_EQ_INT(pr_runtime_dir(dir, out, 8), CM_ERR_TOOBIG);
  setenv("LMSERVE_RUNTIME_DIR", dir, 1);
  TH_CHECK_EQ_INT(pr_runtime_dir(NULL, out, sizeof(out)), 0);
  TH_CHECK_EQ_STR(out, dir);
  unsetenv("LMSERVE_RUNTIME_DIR");
  unlink(file);
  rmdir(dir);
  rmdir(base);
}

/* A ROUTER in a child process echoes every message back to its sender; the
 * parent's DEALER sends every sample over ipc and checks the echoes. */
TH_TEST(dealer_router_across_processes) {
  char base[] = "/tmp/lmserve-proto-proc-XXXXXX";
  TH_REQUIRE(mkdtemp(base) != NULL);
  char dir[256], ep[300];
  TH_REQUIRE(pr_runtime_dir(base, dir, sizeof(dir)) == 0);
  TH_REQUIRE(pr_endpoint(dir, "echo", ep, sizeof(ep)) == 0);
  int ready[2];
  TH_REQUIRE(pipe(ready) == 0);
  fflush(NULL);
  pid_t pid = fork();
  TH_REQUIRE(pid >= 0);
  if (pid == 0) {
    /* child: its own context, created after the fork */
    close(ready[0]);
    void *ctx = zmq_ctx_new();
    struct pr_sock *r = NULL;
    struct cm_arena a;
    int status = 1;
    cm_arena_init(&a, 1 << 16, 8u << 20);
    if (!ctx || pr_sock_open(ctx, ZMQ_ROUTER, 0, &r) || pr_sock_set_timeouts(r, 10000, 10000) ||
        pr_sock_bind(r, ep))
      _exit(2);
    if (write(ready[1], "x", 1) != 1) _exit(3);
    for (int i = 0; i < prs_count(); i++) {
      struct pr_msg m;
      struct pr_rid from;
      if (pr_sock_recv(r, &from, &m, &a, 0) || pr_sock_send(r, &from, &m, 0)) goto out;
      cm_arena_reset(&a);
    }
    status = 0;
  out:
    pr_sock_close(r);
    cm_arena_free(&a);
    zmq_ctx_term(ctx);
    _exit(status);
  }
  close(ready[1]);
  char c;
  TH_REQUIRE(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  void *ctx = zmq_ctx_new();
  struct pr_sock *d;
  TH_REQUIRE(pr_sock_open(ctx, ZMQ_DEALER, 0, &d) == 0);
  TH_REQUIRE(pr_sock_set_timeouts(d, 10000, 10000) == 0);
  TH_REQUIRE(pr_sock_connect(d, ep) == 0);
  struct cm_arena a;
  cm_arena_init(&a, 1 << 16, 8u << 20);
  int echoed = 0;
  for (int i = 0; i < prs_count(); i++) {
    struct pr_msg m, got;
    const char *name;
    prs_build(i, &m, &name);
    if (pr_sock_send(d, NULL, &m, 0) != 0) break;
    int rc = pr_sock_recv(d, NULL, &got, &a, 0);
    if (rc) {
      th_fail(__FILE__, __LINE__, "%s: echo: %s", name, cm_strerror(rc));
      break;
    }
    if (!pr_msg_equal(&m, &got)) th_fail(__FILE__, __LINE__, "%s: echo differs", name);
    echoed++;
    cm_arena_reset(&a);
  }
  TH_CHECK_EQ_INT(echoed, prs_count());
  int st = -1;
  TH_CHECK(waitpid(pid, &st, 0) == pid);
  TH_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  cm_arena_free(&a);
  pr_sock_close(d);
  zmq_ctx_term(ctx);
  char path[400];
  snprintf(path, sizeof(path), "%s/echo.sock", dir);
  unlink(path);
  rmdir(base);
}
