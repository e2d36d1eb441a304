/* test-deploy.c — the deployment files of deploy/, checked by a node script
 * (DEPLOY_SCRIPT, under tests/integration/) that this program runs; meson
 * builds it once per script:
 *
 *   compose      compose.mjs: both compose files against the CLI (services,
 *                endpoints, ranks, ports, health checks, restart policies, GPU
 *                reservations), then the CPU file's topology as processes on
 *                distinct loopback addresses, each role killed in turn until
 *                the cluster serves again;
 *   kubernetes   kubernetes.mjs: deploy/kubernetes rendered and validated
 *                against the Kubernetes API schemas and the CLI, then the
 *                LeaderWorkerSet group run as processes, serving greedy
 *                output equal to `lmserve generate`'s.
 *
 * Skips, loudly, when node 20 or the npm packages the script needs
 * (DEPLOY_PACKAGES, space-separated) are missing (tools/setup installs
 * them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

#ifndef DEPLOY_SCRIPT
#error "DEPLOY_SCRIPT names the node script (compose.mjs, kubernetes.mjs)"
#endif
#ifndef DEPLOY_PACKAGES
#error "DEPLOY_PACKAGES names the npm packages the script needs"
#endif

TH_TEST(deploy_files) {
  th_proc_init(900);
  if (th_node_major() < 20) TH_SKIP("no node 20 or newer on PATH: " DEPLOY_SCRIPT " did not run");
  const char *src = getenv("TH_SOURCE_DIR");
  char pkgs[] = DEPLOY_PACKAGES, script[1024], deploy[1024];
  for (char *save = NULL, *p = strtok_r(pkgs, " ", &save); p; p = strtok_r(NULL, " ", &save)) {
    if (!th_npm_has(p)) {
      fprintf(stderr, "node_modules/%s is missing (run tools/setup)\n", p);
      TH_SKIP("an npm package is missing: " DEPLOY_SCRIPT " did not run");
    }
  }
  snprintf(script, sizeof(script), "%s/integration/" DEPLOY_SCRIPT, th_tests_dir());
  snprintf(deploy, sizeof(deploy), "%s/deploy", src ? src : ".");
  char model[300];
  th_tiny_gemma4_or_skip("deploy", 5, model, sizeof(model));

  char e_bin[1100], e_model[400], e_deploy[1100];
  snprintf(e_bin, sizeof(e_bin), "LMSERVE_BIN=%s", th_lmserve_bin());
  snprintf(e_model, sizeof(e_model), "LMSERVE_TEST_MODEL=%s", model);
  snprintf(e_deploy, sizeof(e_deploy), "LMSERVE_DEPLOY_DIR=%s", deploy);
  char *env[] = {e_bin, e_model, e_deploy, "NO_COLOR=1", NULL};
  th_node_test(script, env, 840000);
}
