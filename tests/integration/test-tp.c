/* test-tp.c — tensor parallelism through `lmserve serve --tensor-parallel-size N`:
 * greedy completions of requests batched together (one with allowed_token_ids, one with
 * bad_words) at sizes 2 and 4 equal size 1 on
 * the tiny Gemma 3, Gemma 4 (KV sharing, per-layer embeddings), Gemma 4 MoE, and
 * Gemma 4 with MTP speculation (tokens identical, where a token may flip only at a
 * near-tie of size 1's logprobs, and logprobs within 0.02 before that; two of the
 * requests ask their prompts' logprobs, within 0.02 of size 1's too); and a rank
 * killed mid-request: the stream ends with an error within 2 s, /health stops
 * answering 200, and the other rank exits instead of waiting forever. */
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cm-time.h"
#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

#define N_REQ   3
#define MAX_TOK 10


/* make-tiny-model ARGS... --out DIR/NAME; 0 or -1. */
static int make_model(const char *dir, const char *name, char *out, size_t size, char *a1, char *a2,
                      char *a3, char *a4) {
  snprintf(out, size, "%s/%s", dir, name);
  char *argv[] = {th_lmserve_bin(), "make-tiny-model", "--out", out, a1, a2, a3, a4, NULL};
  char *so = NULL, *se = NULL;
  int rc = th_run(argv, NULL, NULL, 0, 120000, &so, &se);
  if (rc) fprintf(stderr, "make-tiny-model: %s\n", se ? se : "");
  free(so);
  free(se);
  return rc ? -1 : 0;
}

struct server {
  struct th_proc p;
  int port;
};

/* Starts serve and waits for its URL line; 0 or -1. */
static int start(struct server *s, const char *model, int tp, const char *spec) {
  s->port = th_free_port();
  char port_s[16], tp_s[16];
  snprintf(port_s, sizeof port_s, "%d", s->port);
  snprintf(tp_s, sizeof tp_s, "%d", tp);
  char *sv[16] = {th_lmserve_bin(),
                  "serve",
                  "--port",
                  port_s,
                  "--model",
                  (char *)model,
                  "--tensor-parallel-size",
                  tp_s,
                  "--drain-timeout",
                  "5"};
  int n = 10;
  if (spec) {
    sv[n++] = "--speculative-model";
    sv[n++] = (char *)spec;
  }
  sv[n] = NULL;
  if (th_proc_spawn(&s->p, sv, NULL, 1)) return -1;
  if (th_proc_wait_output(&s->p, "lmserve: serving", 180000)) {
    th_proc_stop(&s->p, 2000);
    return -1;
  }
  char *b = NULL;
  int st = th_http(s->port, "GET", "/health", NULL, 60000, &b);
  free(b);
  return st == 200 ? 0 : -1;
}

static void stop(struct server *s) {
  th_proc_signal(&s->p, SIGTERM);
  th_proc_stop(&s->p, 10000);
}

/* One completion's tokens and logprobs, and the gap between its top two
 * alternatives at each position (from top_logprobs). */
struct answer {
  int n;
  char tokens[MAX_TOK][64];
  double lp[MAX_TOK], gap[MAX_TOK];
  int n_plp;           /* prompt logprobs (the first two requests ask them) */
  double plp[MAX_TOK]; /* each prompt token's after the first */
};

static const char *const prompts[N_REQ] = {"[2,9259,1902]", "[2,651,6037,576,9405,603]",
                                           "[2,1596,476,1744]"};

/* what each request adds: its prompt's logprobs (scored rows over the gathered logits); a
 * set of allowed tokens (each rank masks its vocabulary slice), with the prompt's logprobs
 * too; bad words (drawn on the host from the gathered logits) */
static const char *const extras[N_REQ] = {
    ",\"prompt_logprobs\":1",
    (",\"prompt_logprobs\":2,\"allowed_token_ids\":[9259,1902,651,6037,576,9405,603,1596,476,"
     "1744,100,2000]"),
    ",\"bad_words\":[\"the\",\"a\",\"s t\",\"in\"]"};

/* N_REQ greedy completions sent at once (so the scheduler batches them). */
static int ask_all(int port, struct answer *a) {
  int fds[N_REQ];
  for (int i = 0; i < N_REQ; i++) {
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"logprobs\":2,"
             "\"ignore_eos\":true%s}",
             prompts[i], MAX_TOK, extras[i]);
    fds[i] = th_http_connect(port);
    if (fds[i] < 0) return -1;
    th_http_send(fds[i], "POST", "/v1/completions", body);
  }
  int rc = 0;
  for (int i = 0; i < N_REQ; i++) {
    char *b = NULL;
    int st = th_http_read(fds[i], 120000, &b);
    close(fds[i]);
    json_t *j = st == 200 ? json_loads(b, 0, NULL) : NULL;
    if (!j) fprintf(stderr, "request %d: HTTP %d: %.300s\n", i, st, b ? b : "");
    free(b);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *lp = json_object_get(ch, "logprobs"), *pl = json_object_get(ch, "prompt_logprobs");
    /* each prompt token's own entry (its id, the prompt's id at that place) */
    json_t *ids = json_loads(prompts[i], 0, NULL);
    a[i].n_plp = pl ? (int)json_array_size(pl) - 1 : 0;
    if (i < 2 && (int)json_array_size(ids) != a[i].n_plp + 1) rc = -1; /* they asked */
    for (int t = 0; t < a[i].n_plp && t < MAX_TOK; t++) {
      char key[24];
      snprintf(key, sizeof key, "%lld",
               (long long)json_integer_value(json_array_get(ids, (size_t)t + 1)));
      json_t *e = json_object_get(json_array_get(pl, (size_t)t + 1), key);
      a[i].plp[t] = e ? json_real_value(json_object_get(e, "logprob")) : NAN;
    }
    json_decref(ids);
    json_t *toks = json_object_get(lp, "tokens"), *lps = json_object_get(lp, "token_logprobs"),
           *tops = json_object_get(lp, "top_logprobs");
    a[i].n = (int)json_array_size(toks);
    if (!j || a[i].n < 1 || a[i].n > MAX_TOK) rc = -1;
    for (int t = 0; t < a[i].n && t < MAX_TOK; t++) {
      snprintf(a[i].tokens[t], sizeof a[i].tokens[t], "%s",
               json_string_value(json_array_get(toks, (size_t)t)) ?: "");
      a[i].lp[t] = json_real_value(json_array_get(lps, (size_t)t));
      double best = -INFINITY, second = -INFINITY;
      const char *k;
      json_t *v;
      json_object_foreach(json_array_get(tops, (size_t)t), k, v) {
        double x = json_real_value(v);
        if (x > best)
          second = best, best = x;
        else if (x > second)
          second = x;
      }
      a[i].gap[t] = best - second;
    }
    json_decref(j);
  }
  return rc;
}

/* Compares a size-N answer with size 1's: the same tokens up to a near-tie (after
 * which the sequences may part), logprobs within 0.02 before it. */
static void compare(const char *what, int tp, const struct answer *ref, const struct answer *got) {
  for (int i = 0; i < N_REQ; i++) {
    TH_CHECK_EQ_INT(got[i].n_plp, ref[i].n_plp);
    for (int t = 0; t < ref[i].n_plp && t < got[i].n_plp && t < MAX_TOK; t++)
      if (!(fabs(got[i].plp[t] - ref[i].plp[t]) <= 0.02))
        th_fail(__FILE__, __LINE__,
                "%s, size %d, request %d, prompt token %d: logprob %g, "
                "expected %g",
                what, tp, i, t + 1, got[i].plp[t], ref[i].plp[t]);
    TH_CHECK_EQ_INT(got[i].n, ref[i].n);
    for (int t = 0; t < ref[i].n && t < got[i].n; t++) {
      if (strcmp(ref[i].tokens[t], got[i].tokens[t])) {
        if (ref[i].gap[t] < 1e-3) break; /* a near-tie may flip */
        th_fail(__FILE__, __LINE__, "%s, size %d, request %d, token %d: '%s', expected '%s'", what,
                tp, i, t, got[i].tokens[t], ref[i].tokens[t]);
        break;
      }
      if (!(fabs(got[i].lp[t] - ref[i].lp[t]) <= 0.02))
        th_fail(__FILE__, __LINE__, "%s, size %d, request %d, token %d: logprob %g, expected %g",
                what, tp, i, t, got[i].lp[t], ref[i].lp[t]);
    }
  }
}

static void check_sizes(const char *what, const char *model, const char *spec, int max_tp) {
  struct answer ref[N_REQ], got[N_REQ];
  struct server s;
  TH_REQUIRE(start(&s, model, 1, spec) == 0);
  int rc = ask_all(s.port, ref);
  stop(&s);
  TH_REQUIRE(rc == 0);
  for (int tp = 2; tp <= max_tp; tp *= 2) {
    if (start(&s, model, tp, spec)) {
      th_fail(__FILE__, __LINE__, "%s: serve at size %d did not come up", what, tp);
      continue;
    }
    rc = ask_all(s.port, got);
    stop(&s);
    if (rc) {
      th_fail(__FILE__, __LINE__, "%s: requests at size %d failed", what, tp);
      continue;
    }
    compare(what, tp, ref, got);
  }
}

static int setup(char *tmp, size_t n, char *g4, size_t g4n) {
  th_proc_init(1700);
  if (th_tmpdir("tp", tmp, n)) return -1;
  return th_tiny_gemma4(tmp, 3, g4, g4n);
}

TH_TEST(tp_gemma4_sizes_2_and_4_match_1) {
  char tmp[256], g4[320];
  int mk = setup(tmp, sizeof tmp, g4, sizeof g4);
  TH_REQUIRE(mk >= 0);
  if (mk) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  check_sizes("gemma4", g4, NULL, 4);
}

TH_TEST(tp_gemma3_and_moe_size_2_match_1) {
  char tmp[256], g4[320], g3[320], moe[320];
  int mk = setup(tmp, sizeof tmp, g4, sizeof g4);
  TH_REQUIRE(mk >= 0);
  if (mk) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  TH_REQUIRE(make_model(tmp, "g3", g3, sizeof g3, "--arch", "gemma3", "--seed", "4") == 0);
  check_sizes("gemma3", g3, NULL, 2);
  TH_REQUIRE(make_model(tmp, "moe", moe, sizeof moe, "--arch", "gemma4", "--moe", NULL) == 0);
  check_sizes("gemma4-moe", moe, NULL, 2);
}

TH_TEST(tp_speculative_size_2_matches_1) {
  char tmp[256], g4[320], asst[320];
  int mk = setup(tmp, sizeof tmp, g4, sizeof g4);
  TH_REQUIRE(mk >= 0);
  if (mk) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  TH_REQUIRE(make_model(tmp, "asst", asst, sizeof asst, "--arch", "gemma4-assistant", "--target",
                        g4) == 0);
  check_sizes("gemma4+mtp", g4, asst, 2);
}

static int alive(int pid) {
  char path[64], st[512] = "";
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int ok = fgets(st, sizeof st, f) != NULL;
  fclose(f);
  const char *p = strrchr(st, ')');
  return ok && p && p[2] != 'Z'; /* a zombie has exited */
}

TH_TEST(tp_rank_killed_mid_request_fails_fast) {
  char tmp[256], g4[320];
  int mk = setup(tmp, sizeof tmp, g4, sizeof g4);
  TH_REQUIRE(mk >= 0);
  if (mk) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  struct server s;
  TH_REQUIRE(start(&s, g4, 2, NULL) == 0);
  int r0 = th_pid_with(0, "--rank 0", g4, NULL), r1 = th_pid_with(0, "--rank 1", g4, NULL);
  TH_REQUIRE(r0 > 0 && r1 > 0);
  int fd = th_http_post_open(s.port, "/v1/completions",
                             "{\"prompt\":[2,9259,1902],\"max_tokens\":6000,\"temperature\":0,"
                             "\"ignore_eos\":true,\"stream\":true}");
  /* the stream is running: some tokens have come */
  char buf[65536];
  size_t got = 0;
  double t_end = cm_time_s() + 60;
  while (cm_time_s() < t_end && got < 4096) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 1000) <= 0) continue;
    ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  TH_REQUIRE(got >= 4096);
  double t_kill = cm_time_s();
  kill(r1, SIGKILL);
  /* the stream ends (with an error event) within 2 s */
  int ended = 0, error_seen = 0;
  got = 0;
  while (!ended && cm_time_s() < t_kill + 5) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 100) <= 0) continue;
    ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
    if (k <= 0) {
      ended = 1;
      break;
    }
    got += (size_t)k;
    buf[got] = 0;
    if (strstr(buf, "\"error\"")) error_seen = 1;
    if (strstr(buf, "[DONE]") || strstr(buf, "0\r\n\r\n")) ended = 1;
    if (got > sizeof buf / 2) { /* keep the tail only */
      memmove(buf, buf + got - 256, 256);
      got = 256;
    }
  }
  double t_stream = cm_time_s() - t_kill;
  close(fd);
  TH_CHECK(ended);
  TH_CHECK(error_seen);
  if (!(t_stream < 2.0))
    th_fail(__FILE__, __LINE__, "the stream ended %.2f s after the kill", t_stream);
  /* /health stops answering 200 within 2 s */
  int health = 200;
  while (health == 200 && cm_time_s() < t_kill + 5) {
    char *b = NULL;
    health = th_http(s.port, "GET", "/health", NULL, 2000, &b);
    free(b);
    if (health == 200) usleep(50000);
  }
  double t_health = cm_time_s() - t_kill;
  TH_CHECK(health != 200);
  if (!(t_health < 2.0))
    th_fail(__FILE__, __LINE__, "/health was 200 %.2f s after the kill", t_health);
  /* the surviving rank does not wait forever */
  while (alive(r0) && cm_time_s() < t_kill + 5)
    usleep(50000);
  TH_CHECK(!alive(r0));
  stop(&s);
  TH_CHECK(th_pid_with(0, "--rank", g4, NULL) < 0);
}

/* Start-up refusals: a size that cannot split the heads, a size over the limit, and
 * two ranks whose models differ only in their shard shapes (the MoE variant has the
 * same KV layout and vocabulary: only READY's shard checksum tells them apart). */
TH_TEST(tp_start_up_refusals) {
  char tmp[256], g4[320], moe[320];
  int mk = setup(tmp, sizeof tmp, g4, sizeof g4);
  TH_REQUIRE(mk >= 0);
  if (mk) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  char ep[400], fep[400];
  snprintf(ep, sizeof ep, "ipc://%s/workers", tmp);
  snprintf(fep, sizeof fep, "ipc://%s/frontend", tmp);
  struct {
    const char *world, *says;
  } bad[] = {{"8", "num_attention_heads = 4 cannot be split"}, {"100", "must be 1..64"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *w[] = {th_lmserve_bin(),
                 "worker",
                 "--model",
                 g4,
                 "--scheduler",
                 ep,
                 "--rank",
                 "0",
                 "--world-size",
                 (char *)bad[i].world,
                 NULL};
    char *so = NULL, *se = NULL;
    TH_CHECK_EQ_INT(th_run(w, NULL, NULL, 0, 60000, &so, &se), 2);
    if (!se || !strstr(se, bad[i].says))
      th_fail(__FILE__, __LINE__, "size %s: stderr says '%s'", bad[i].world, se ? se : "");
    free(so);
    free(se);
  }
  TH_REQUIRE(make_model(tmp, "moe", moe, sizeof moe, "--arch", "gemma4", "--moe", NULL) == 0);
  char *sc[] = {
      th_lmserve_bin(), "scheduler", "--world-size", "2", "--worker-endpoint", ep, "--frontend-endpoint",
      fep,   NULL};
  char *w0[] = {th_lmserve_bin(),    "worker", "--model",      g4,  "--scheduler", ep,
                "--rank", "0",      "--world-size", "2", NULL};
  char *w1[] = {th_lmserve_bin(),    "worker", "--model",      moe, "--scheduler", ep,
                "--rank", "1",      "--world-size", "2", NULL};
  struct th_proc ps, p0, p1;
  TH_REQUIRE(th_proc_spawn(&ps, sc, NULL, 1) == 0);
  TH_REQUIRE(th_proc_spawn(&p0, w0, NULL, 0) == 0);
  TH_REQUIRE(th_proc_spawn(&p1, w1, NULL, 0) == 0);
  /* the scheduler logs on stderr */
  char log[16384] = "";
  size_t got = 0;
  double end = cm_time_s() + 120;
  while (!strstr(log, "shard checksum differ") && cm_time_s() < end && got < sizeof log - 1) {
    struct pollfd pf = {ps.err_fd, POLLIN, 0};
    if (poll(&pf, 1, 1000) <= 0) continue;
    ssize_t k = read(ps.err_fd, log + got, sizeof log - 1 - got);
    if (k <= 0) break;
    got += (size_t)k;
    log[got] = 0;
  }
  TH_CHECK(strstr(log, "shard checksum differ") != NULL);
  TH_CHECK(strstr(log, "serving:") == NULL);
  th_proc_stop(&p1, 2000);
  th_proc_stop(&p0, 2000);
  th_proc_stop(&ps, 2000);
}

/* The offline path: `lmserve generate --tensor-parallel-size N` forks its ranks and
 * prints the same greedy ids as one process (a fixed model and prompt: no near-tie). */
TH_TEST(tp_generate_offline_matches) {
  char tmp[256], g4[320], g3[320];
  int mk = setup(tmp, sizeof tmp, g4, sizeof g4);
  TH_REQUIRE(mk >= 0);
  if (mk) TH_SKIP("no Gemma tokenizer in the tiny model (run tools/setup)");
  TH_REQUIRE(make_model(tmp, "g3", g3, sizeof g3, "--arch", "gemma3", "--seed", "4") == 0);
  const char *models[2] = {g4, g3};
  for (int k = 0; k < 2; k++) {
    char ref[2048] = "";
    for (int tp = 1; tp <= 4; tp *= 2) {
      char tp_s[16];
      snprintf(tp_s, sizeof tp_s, "%d", tp);
      char *gen[] = {th_lmserve_bin(),          "generate",
                     "--model",      (char *)models[k],
                     "--prompt-ids", "2,9259,1902",
                     "--max-tokens", "12",
                     "--ignore-eos", "--tensor-parallel-size",
                     tp_s,           NULL};
      char *so = NULL, *se = NULL;
      int rc = th_run(gen, NULL, NULL, 0, 180000, &so, &se);
      TH_CHECK_EQ_INT(rc, 0);
      char line[2048] = "";
      if (so) sscanf(so, "%2047[^\n]", line);
      if (tp == 1)
        snprintf(ref, sizeof ref, "%s", line);
      else if (strcmp(line, ref))
        th_fail(__FILE__, __LINE__, "%s at size %d: %s, expected %s", models[k], tp, line, ref);
      free(so);
      free(se);
    }
    TH_CHECK(ref[0] == '[');
  }
}

/* MTP speculation offline at sizes 1, 2 and 4 with a partly agreeing target and
 * assistant (--echo with a leak, --agree): the same ids, and the same count of drafts
 * proposed and accepted — the draft model, sharded like the target, proposes the same
 * tokens at every size. */
TH_TEST(tp_generate_speculative_sizes_2_and_4) {
  char tmp[256], tgt[320], asst[320];
  th_proc_init(600);
  TH_REQUIRE(th_tmpdir("tp-spec", tmp, sizeof tmp) == 0);
  TH_REQUIRE(make_model(tmp, "echo", tgt, sizeof tgt, "--arch", "gemma4", "--echo", NULL) == 0);
  char *mk[] = {th_lmserve_bin(),
                "make-tiny-model",
                "--arch",
                "gemma4-assistant",
                "--agree",
                "--target",
                tgt,
                "--out",
                asst,
                NULL};
  snprintf(asst, sizeof asst, "%s/agree", tmp);
  char *so = NULL, *se = NULL;
  TH_REQUIRE(th_run(mk, NULL, NULL, 0, 120000, &so, &se) == 0);
  free(so);
  free(se);
  char ref_ids[2048] = "", ref_counts[256] = "";
  for (int tp = 1; tp <= 4; tp *= 2) {
    char tp_s[16];
    snprintf(tp_s, sizeof tp_s, "%d", tp);
    char *gen[] = {th_lmserve_bin(),
                   "generate",
                   "--model",
                   tgt,
                   "--draft",
                   asst,
                   "--prompt-ids",
                   "2,9259,1902",
                   "--max-tokens",
                   "16",
                   "--ignore-eos",
                   "--tensor-parallel-size",
                   tp_s,
                   NULL};
    char *env[] = {"LMSERVE_LOG=error", NULL};
    so = se = NULL;
    TH_CHECK_EQ_INT(th_run(gen, env, NULL, 0, 180000, &so, &se), 0);
    char ids[2048] = "", counts[256] = "";
    if (so) sscanf(so, "%2047[^\n]", ids);
    const char *c = se ? strstr(se, "draft tokens proposed") : NULL;
    if (c) sscanf(c - 8 > se ? c - 8 : se, "%255[^\n]", counts);
    if (tp == 1) {
      snprintf(ref_ids, sizeof ref_ids, "%s", ids);
      snprintf(ref_counts, sizeof ref_counts, "%s", counts);
      TH_CHECK(strstr(se ? se : "", " 0 accepted") == NULL); /* the pair agrees on some */
    } else {
      if (strcmp(ids, ref_ids))
        th_fail(__FILE__, __LINE__, "size %d: %s, expected %s", tp, ids, ref_ids);
      if (strcmp(counts, ref_counts))
        th_fail(__FILE__, __LINE__, "size %d: '%s', expected '%s'", tp, counts, ref_counts);
    }
    free(so);
    free(se);
  }
  TH_CHECK(ref_ids[0] == '[' && ref_counts[0]);
}
