/* test-soak.c — the CI version of the soak: `lmserve serve` on the tiny model
 * under `lmserve bench soak` for 60 s at a few requests a second, with 5% of
 * them aborted by the client, 1% malformed, and the worker killed every 20 s
 * (serve restarts it). bench soak checks the books — every request answered
 * (ok, rejected with an error object, failed with an error event, aborted by
 * the client, or refused as malformed), none lost, no malformed one accepted —
 * and, once idle, the KV usage and the frontend's and scheduler's descriptor
 * counts back at their baselines and the long-lived roles' memory within
 * 16 MB of where it was after warm-up. serve runs from a copy of the binary
 * that is deleted once it is up (an upgrade in place): it must still restart
 * the workers it loses. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

/* Copies the file at src to dst (mode 0755): 0 or -1. */
static int copy_file(const char *src, const char *dst) {
  int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, rc = -1;
  if (in >= 0) out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (in >= 0 && out >= 0) {
    char buf[1 << 16];
    ssize_t n;
    rc = 0;
    while ((n = read(in, buf, sizeof(buf))) > 0)
      if (write(out, buf, (size_t)n) != n) rc = -1;
    if (n < 0) rc = -1;
  }
  if (in >= 0) close(in);
  if (out >= 0 && close(out) != 0) rc = -1;
  return rc;
}

/* AddressSanitizer holds freed memory in quarantine (up to 256 MB): under it, the
 * memory check only catches gross growth. */
#if defined(__SANITIZE_ADDRESS__)
#define SOAK_MAX_GROWTH_MB "512"
#else
#define SOAK_MAX_GROWTH_MB "16"
#endif

TH_TEST(soak_sixty_seconds) {
  th_proc_init(600);
  char model[300];
  th_tiny_gemma4_or_skip("soak", 7, model, sizeof(model));
  int port = th_free_port();
  TH_REQUIRE(port > 0);
  char port_s[16], url[64], pid_s[16];
  snprintf(port_s, sizeof(port_s), "%d", port);
  snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
  char dir[] = "/tmp/lmserve-soak-XXXXXX", copy[64];
  TH_REQUIRE(mkdtemp(dir) != NULL);
  snprintf(copy, sizeof(copy), "%s/lmserve", dir);
  TH_REQUIRE(copy_file(th_lmserve_bin(), copy) == 0);
  static char *env[] = {"LMSERVE_DEVICE=cpu", NULL};
  struct th_proc s;
  TH_REQUIRE(th_proc_spawnl(&s, env, 0, NULL, copy, "serve", "--model", model, "--port", port_s,
                            "--kv-cache-memory", "64M", "--threads", "1", "--drain-timeout", "2",
                            NULL) == 0);
  int st = 0;
  for (int i = 0; i < 1200 && st != 200; i++) {
    char *body = NULL;
    st = th_http(port, "GET", "/health", NULL, 1000, &body);
    free(body);
    if (st != 200) usleep(100000);
  }
  TH_REQUIRE(st == 200);
  TH_REQUIRE(unlink(copy) == 0 && rmdir(dir) == 0); /* replaced under the running server */
  snprintf(pid_s, sizeof(pid_s), "%d", (int)s.pid);
  char *argv[] = {th_lmserve_bin(),
                  "bench",
                  "soak",
                  "--url",
                  url,
                  "--duration",
                  "60",
                  "--request-rate",
                  "3",
                  "--input-len",
                  "24",
                  "--output-len",
                  "12",
                  "--abort-rate",
                  "0.05",
                  "--malformed-rate",
                  "0.01",
                  "--kill-worker-every",
                  "20",
                  "--serve-pid",
                  pid_s,
                  "--warmup",
                  "10",
                  "--request-timeout",
                  "60",
                  NULL};
  char *out = NULL, *err = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 300000, &out, &err);
  if (out) fputs(out, stderr);
  TH_CHECK_EQ_INT(rc, 0);
  TH_CHECK(out && strstr(out, "SOAK PASSED"));
  TH_CHECK(out && strstr(out, "workers killed:                    2"));
  free(out), free(err);
  th_proc_check_exit(&s, SIGTERM, 30000);
}
