/* test-compose.c — deploy/docker-compose.yml and docker-compose.cuda.yml: runs
 * compose.mjs under node, which checks both files against the CLI (services,
 * endpoints, ranks, ports, health checks, restart policies, GPU reservations)
 * and runs the CPU file's topology as processes on distinct loopback addresses,
 * killing each role in turn and waiting for the cluster to serve again.
 * Skips, loudly, when node or node_modules/yaml is missing (tools/setup
 * installs both). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

TH_TEST(compose_files_and_topology) {
  th_proc_init(900);
  char *ver[] = {"node", "--version", NULL};
  char *out = NULL, *err = NULL;
  int rc = th_run(ver, NULL, NULL, 0, 60000, &out, &err);
  int major = rc == 0 && out && out[0] == 'v' ? atoi(out + 1) : 0;
  free(out), free(err);
  if (rc != 0 || major < 20)
    TH_SKIP("no node 20 or newer on PATH: the compose files were not checked");
  const char *src = getenv("TH_SOURCE_DIR");
  char pkg[1024], script[1024], deploy[1024];
  snprintf(pkg, sizeof(pkg), "%s/node_modules/yaml/package.json", src ? src : ".");
  snprintf(script, sizeof(script), "%s/integration/compose.mjs", th_tests_dir());
  snprintf(deploy, sizeof(deploy), "%s/deploy", src ? src : ".");
  if (access(pkg, R_OK) != 0)
    TH_SKIP("node_modules/yaml is missing (run tools/setup): the compose files were not checked");
  char model[300];
  th_tiny_gemma4_or_skip("compose", 5, model, sizeof(model));

  char e_bin[1100], e_model[400], e_deploy[1100];
  snprintf(e_bin, sizeof(e_bin), "LMSERVE_BIN=%s", th_lmserve_bin());
  snprintf(e_model, sizeof(e_model), "LMSERVE_TEST_MODEL=%s", model);
  snprintf(e_deploy, sizeof(e_deploy), "LMSERVE_DEPLOY_DIR=%s", deploy);
  char *env[] = {e_bin, e_model, e_deploy, "NO_COLOR=1", NULL};
  char *argv[] = {"node", "--test-reporter=spec", script, NULL};
  struct th_proc node;
  TH_REQUIRE(th_proc_spawn(&node, argv, env, 0) == 0);
  rc = th_proc_wait(&node, 840000);
  TH_CHECK_EQ_INT(rc, 0);
  TH_CHECK(node.exited && WIFEXITED(node.status));
  if (node.exited && WIFEXITED(node.status) && WEXITSTATUS(node.status) != 0)
    th_fail(__FILE__, __LINE__, "compose.mjs failed (exit %d)", WEXITSTATUS(node.status));
  th_proc_stop(&node, 1000);
}
