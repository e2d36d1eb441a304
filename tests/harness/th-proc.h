/* th-proc.h — start real processes from tests, with timeouts, and always
 * kill them.
 *
 * Each child runs in its own process group with PR_SET_PDEATHSIG(SIGKILL), so
 * it dies with the test even if the test crashes. Every live child is also
 * killed (whole group, SIGKILL) by an atexit handler and by the handlers for
 * SIGINT/SIGTERM/SIGALRM/SIGSEGV/SIGABRT that th_proc_init installs, and
 * th_proc_init(seconds) arms a watchdog alarm for the whole test (times
 * TH_TIME_SCALE where that is set: tools/test sets it for the sanitized build). */
#ifndef LMSERVE_TH_PROC_H
#define LMSERVE_TH_PROC_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct th_proc {
  pid_t pid;  /* 0 when not running */
  int status; /* wait status once reaped */
  int exited; /* 1 once reaped */
  int out_fd; /* read end of the child's stdout when captured, else -1 */
  int err_fd; /* read end of the child's stderr when captured, else -1 */
};

/* Installs the kill-on-exit handlers and a watchdog of `timeout_s` seconds
 * (0: none). Call once at the start of an integration test. */
void th_proc_init(unsigned timeout_s);

/* Starts argv[0] (looked up in PATH if it has no '/'). `env` entries
 * ("K=V") are added to the inherited environment. With capture, stdout and
 * stderr are pipes the test reads via out_fd / err_fd; otherwise they are
 * inherited. Returns 0 or a negative errno. */
int th_proc_spawn(struct th_proc *p, char *const argv[], char *const env[], int capture);

/* Waits up to timeout_ms for the child to exit. Returns 0 when it exited
 * (status in p->status), -ETIMEDOUT otherwise (the child keeps running). */
int th_proc_wait(struct th_proc *p, int timeout_ms);

/* Sends `sig` to the child's process group. */
void th_proc_signal(struct th_proc *p, int sig);

/* Sends `sig` (0: none) to the child's group, waits up to timeout_ms and checks (as a
 * test check) that it exits with status 0: 0 when it did, 1 when it ended otherwise, -1
 * when it did not end in time. */
int th_proc_check_exit(struct th_proc *p, int sig, int timeout_ms);

/* SIGTERM, wait up to grace_ms, then SIGKILL; reaps; closes pipes. */
void th_proc_stop(struct th_proc *p, int grace_ms);

/* Reads everything from fd until EOF or timeout_ms; returns a malloc'd,
 * NUL-terminated buffer (caller frees) and its length in *len. */
char *th_read_all(int fd, int timeout_ms, size_t *len);

/* Runs a command to completion with a timeout, capturing stdout and stderr.
 * Returns the exit code (0..255), 128+signal, or -ETIMEDOUT (child killed).
 * *out / *err may be NULL; when not, they receive malloc'd buffers. */
int th_run(char *const argv[], char *const env[], const char *stdin_data, size_t stdin_len,
           int timeout_ms, char **out, char **err);

/* Reads a captured child's stdout until `needle` appears (within the first
 * 4 KiB), EOF or timeout_ms without output: 0 when it appeared, else -1. */
int th_proc_wait_output(struct th_proc *p, const char *needle, int timeout_ms);

/* A loopback TCP port nobody listens on right now (for servers that need
 * a port number up front; another process may still take it), or -1. */
int th_free_port(void);

/* A fresh folder $TMPDIR/lmserve-NAME-XXXXXX (mode 0700), removed with all it
 * holds when the test exits; its path in dir (size bytes). 0 or -1. */
int th_tmpdir(const char *name, char *dir, size_t size);

/* `lmserve make-tiny-model --arch gemma4 --seed SEED --out DIR/m` with
 * $LMSERVE_BIN; the model's path in out (size bytes). 0; 1 when the model has
 * no tokenizer.json (the set-up has not run: the caller skips); -1 when it
 * could not be made. */
int th_tiny_gemma4(const char *dir, int seed, char *out, size_t size);

/* th_tmpdir(name) with th_tiny_gemma4(seed) in it: the model's path in model (size
 * bytes). Fails the test when the model cannot be made, skips it when the model has
 * no tokenizer. */
void th_tiny_gemma4_or_skip(const char *name, int seed, char *model, size_t size);

/* `lmserve serve --port PORT --model MODEL --drain-timeout 10 EXTRA...` (extra:
 * NULL-terminated, or NULL) with LMSERVE_LOG=warn and its output captured, on a free
 * loopback port, waited for (up to 240 s) until the whole stack serves: the port, or
 * -1 when it did not start (the process is stopped then). th_proc_stop ends it. */
int th_serve_start(struct th_proc *p, const char *model, char *const *extra);
/* th_serve_start with the entries of more_env ("K=V", NULL-terminated, at most 6) added to
 * serve's environment after LMSERVE_LOG=warn (so one of them may replace it). */
int th_serve_start_env(struct th_proc *p, const char *model, char *const *more_env,
                       char *const *extra);

/* ---- the process table (/proc) ---- */

/* A process other than this one, a child of `parent` when parent > 0, whose command
 * line holds each of the texts (they end with NULL): its pid, or -1. */
int th_pid_with(int parent, ...) __attribute__((sentinel));
/* How many processes other than this one have a command line that holds needle. */
int th_procs_with(const char *needle);

/* The lmserve binary under test: $LMSERVE_BIN, else build/tools/lmserve. */
char *th_lmserve_bin(void);

/* What a finished command wrote (malloc'd, NUL-terminated; NULL before any run). */
struct th_out {
  char *out, *err;
};
void th_out_free(struct th_out *o);

/* The most arguments th_lmserve and th_proc_spawnl take (more fail the test). */
#define TH_MAX_ARGS 40

/* Runs `lmserve ARG...` (the arguments end with NULL) to completion with th_run: its
 * result. o's previous buffers are freed first, so one th_out serves a series of runs;
 * th_out_free it after the last. */
int th_lmserve(struct th_out *o, int timeout_ms, ...) __attribute__((sentinel));

/* A command line lmserve must refuse: its arguments (up to a NULL), the exit code it must
 * end with and a text its stderr must hold. */
struct th_refusal {
  const char *args[16];
  int code;
  const char *says;
};
/* Runs `lmserve ARGS...` for each of cases[0..n) (within timeout_ms each) and checks, as
 * test checks, its exit code and what it said; a failure shows the command line. */
void th_lmserve_refusals(const struct th_refusal *cases, int n, int timeout_ms);

/* th_proc_spawn (env, capture as there) of `PROG ARG... EXTRA...`: the arguments end with
 * NULL, then come the NULL-terminated extra ones (extra may be NULL). */
int th_proc_spawnl(struct th_proc *p, char *const env[], int capture, char *const *extra,
                   const char *prog, ...) __attribute__((sentinel));

/* What the integration tests give a worker of the tiny model: the KV memory, block size,
 * step budget, running cap and threads (as lmserve worker arguments). */
#define TH_TINY_WORKER_ARGS                                                                        \
  "--kv-cache-memory", "4M", "--block-size", "16", "--max-num-batched-tokens", "64",               \
      "--max-num-seqs", "8", "--threads", "1"

/* `lmserve generate --model MODEL --prompt-ids PROMPT --max-tokens max_tokens` (greedy, to
 * the end of the sequence at most) within 2 minutes: the ids it printed, comma-separated,
 * in ids (size bytes); the test stops when it printed none. */
void th_generate_ids(const char *model, const char *prompt, const char *max_tokens, char *ids,
                     size_t size);

/* `lmserve generate --model MODEL --prompt-ids PROMPT --max-tokens max_tokens --ignore-eos
 * --threads 1` within timeout_ms: the ids it prints, in out[0..max_tokens); how many,
 * or -1 (with what it said on stderr). */
int th_generate(const char *model, const uint32_t *prompt, int n, int max_tokens, int timeout_ms,
                uint32_t *out);

/* The major version of the `node` on PATH ("v20.11.0": 20); 0 without one. */
int th_node_major(void);

/* 1 when the npm package `name` is installed in the source tree's node_modules
 * ($TH_SOURCE_DIR, else the current folder). */
int th_npm_has(const char *name);

/* A python3 with numpy (LMSERVE_PYTHON, the one on PATH, else Debian's /usr/bin/python3:
 * a PATH may put another interpreter first), or a skip that says what is missing and that
 * `what` is not checked against tests/reference/SCRIPT. */
const char *th_require_numpy(const char *what, const char *script);

/* Runs `PYTHON tests/reference/SCRIPT ARGS...` (args NULL-terminated, at most 20; python
 * from th_require_numpy): its exit status (a negative cm_err when it could not run),
 * what it wrote to stdout and stderr into log[n]. */
int th_reference_run(const char *python, const char *script, char *const *args, char *log,
                     size_t n);
/* The same, failing the test at file:line with its output and stopping it unless the
 * script exits 0. */
void th_reference_at(const char *file, int line, const char *python, const char *script,
                     char *const *args);
#define th_reference(python, script, ...)                                                          \
  th_reference_at(__FILE__, __LINE__, (python), (script), (char *[]){__VA_ARGS__, NULL})

/* Runs `node --test-reporter=spec SCRIPT` (`node SCRIPT`, whose report is TAP, before
 * node 20) with env added, its output going into the test's log, and checks (as test
 * checks) that it exits 0 within timeout_ms, naming the script when it does not. */
void th_node_test(const char *script, char *const env[], int timeout_ms);

#endif
