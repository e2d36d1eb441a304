/* sch-main.c — the `lmserve scheduler` subcommand: flags, endpoints, signals, and the
 * scheduler server (sch-server.h) until SIGTERM or SIGINT. */
#include "scheduler/sch-main.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-log.h"
#include "proto/pr-zmq.h"
#include "scheduler/sch-server.h"

static volatile sig_atomic_t g_stop;

static void on_stop_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

/* Accepts full endpoints and bare names (ipc sockets in the runtime directory). */
static int resolve_endpoint(const char *flag, const char *in, char *out, size_t len) {
  char dir[512];
  const char *d = NULL;
  if (!strstr(in, "://")) {
    int rc = pr_runtime_dir(NULL, dir, sizeof(dir));
    if (rc) {
      fprintf(stderr, "lmserve scheduler: no runtime directory for --%s: %s\n", flag,
              cm_strerror(rc));
      return rc;
    }
    d = dir;
  }
  int rc = pr_endpoint(d, in, out, len);
  if (rc) fprintf(stderr, "lmserve scheduler: bad --%s '%s': %s\n", flag, in, cm_strerror(rc));
  return rc;
}

int sch_main(int argc, char **argv) {
  const char *model = NULL, *front_ep = NULL, *work_ep = NULL;
  int64_t world = 1, max_seqs = 256, max_batched = 8192, max_len = 0, spec_k = 0, spec_disable = 0,
          max_waiting = 4096;
  double worker_timeout = 0, beat_interval = 1;
  int64_t beat_limit = 3;
  int prefix_caching = 1, async_sched = 1;
  struct cm_opt opts[] = {
      {"model", CM_OPT_STR, &model, "DIR", "model directory (for logs; the workers load it)", 0, 0,
       0, 0, NULL},
      {"frontend-endpoint", CM_OPT_STR, &front_ep, "ENDPOINT",
       "endpoint frontends connect to (ipc://, tcp:// or a bare name)", 0, 0, 0, 0, NULL},
      {"worker-endpoint", CM_OPT_STR, &work_ep, "ENDPOINT",
       "endpoint workers connect to (ipc://, tcp:// or a bare name)", 0, 0, 0, 0, NULL},
      {"world-size", CM_OPT_INT, &world, "N", "worker ranks to wait for (default 1)", 1, 1024, 0, 0,
       NULL},
      {"max-num-seqs", CM_OPT_INT, &max_seqs, "N", "running requests at most (default 256)", 1,
       65536, 0, 0, NULL},
      {"max-num-batched-tokens", CM_OPT_INT, &max_batched, "N", "tokens per step (default 8192)", 1,
       INT32_MAX, 0, 0, NULL},
      {"max-model-len", CM_OPT_INT, &max_len, "N",
       "context length in tokens (default: the model's)", 1, INT32_MAX, 0, 0, NULL},
      {"enable-prefix-caching", CM_OPT_BOOL, &prefix_caching, NULL,
       "reuse KV blocks of shared prompt prefixes (default on)", 0, 0, 0, 0, NULL},
      {"num-speculative-tokens", CM_OPT_INT, &spec_k, "K",
       "draft tokens per decode step (default 0)", 0, 64, 0, 0, NULL},
      {"speculative-disable-by-batch-size", CM_OPT_INT, &spec_disable, "N",
       "decode without drafts while N or more requests run (vLLM's; default: always draft)", 2,
       65536, 0, 0, NULL},
      {"async-scheduling", CM_OPT_BOOL, &async_sched, NULL,
       "plan the next step while the workers run one (default on)", 0, 0, 0, 0, NULL},
      {"max-waiting", CM_OPT_INT, &max_waiting, "N", "queued requests at most (default 4096)", 1,
       1 << 19, 0, 0, NULL},
      {"heartbeat-interval", CM_OPT_DOUBLE, &beat_interval, "S",
       "seconds between a worker's heartbeats (its own --heartbeat-interval; default 1)", 0, 0,
       0.01, 600, NULL},
      {"heartbeat-limit", CM_OPT_INT, &beat_limit, "N",
       "heartbeats a worker may miss before it counts as dead (default 3)", 1, 1000, 0, 0, NULL},
      {"worker-timeout", CM_OPT_DOUBLE, &worker_timeout, "S",
       "seconds without a message before a worker counts as dead (default: the interval "
       "times the limit)",
       0, 0, 0.05, 3600, NULL},
      {0},
  };
  int rc = cm_args_parse("lmserve scheduler", "run the scheduler role alone", opts, argc, argv, 1,
                         NULL, 0, NULL);
  if (rc == CM_ARGS_HELP) return 0;
  if (rc < 0) return 2;
  if (!front_ep || !work_ep) {
    fprintf(stderr, "lmserve scheduler: --frontend-endpoint and --worker-endpoint are required\n");
    return 2;
  }
  char fe[512], we[512];
  if (resolve_endpoint("frontend-endpoint", front_ep, fe, sizeof(fe)) ||
      resolve_endpoint("worker-endpoint", work_ep, we, sizeof(we)))
    return 2;

  struct sch_server_config cfg;
  sch_server_config_default(&cfg);
  cfg.frontend_endpoint = fe;
  cfg.worker_endpoint = we;
  cfg.model_dir = model;
  cfg.world_size = (int32_t)world;
  cfg.max_num_seqs = (int32_t)max_seqs;
  cfg.max_num_batched_tokens = (int32_t)max_batched;
  cfg.max_model_len = (int32_t)max_len;
  cfg.num_spec_tokens = (int32_t)spec_k;
  cfg.spec_disable_batch = (int32_t)spec_disable;
  cfg.max_waiting = (int32_t)max_waiting;
  cfg.enable_prefix_caching = prefix_caching != 0;
  cfg.async_scheduling = async_sched != 0;
  if (worker_timeout <= 0) worker_timeout = beat_interval * (double)beat_limit;
  if (worker_timeout > 3600) worker_timeout = 3600;
  cfg.worker_timeout_ms = (uint32_t)(worker_timeout * 1000 + 0.5);

  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  struct sch_server *srv = NULL;
  if ((rc = sch_server_create(&cfg, &srv))) {
    fprintf(stderr, "lmserve scheduler: cannot start: %s\n", cm_strerror(rc));
    return 1;
  }
  rc = sch_server_run(srv, &g_stop);
  if (g_stop) cm_info("sch", "stop signal: shutting down the workers");
  sch_server_destroy(srv);
  return rc ? 1 : 0;
}
