/* test-structured.c — structured outputs (regex, choice, JSON mode, JSON Schema)
 * through `lmserve serve` on the tiny Gemma 4, driven over HTTP: concurrent
 * constrained requests, greedy and seeded, beside unconstrained ones in the
 * same steps, get the same answers (text, logprobs, finish reason, usage)
 * synchronously, with async scheduling and a KV pool small enough to preempt
 * them (their generated tokens run again and the workers' matchers follow
 * them, from the prefix cache too), and under tensor parallelism 2 (each rank
 * masks its rows alike: the greedy rows' texts are those of one rank). What the answers must match
 * is checked by api-structured.mjs with JavaScript's own RegExp and JSON.parse.
 * A grammar the compiler takes most of a second to refuse holds no other request. */
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/th-http.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"

#define NREQ 12
#ifdef __SANITIZE_ADDRESS__
#define GEN 12 /* the sanitizer tree's kernels are ~20 times slower */
#else
#define GEN 40
#endif

static const char *const constraints[] = {
    "\"structured_outputs\":{\"regex\":\"[a-z]{2,6}( [a-z]{2,6}){0,5}\\\\.\"}",
    "\"guided_choice\":[\"north\",\"south\",\"east\",\"west\",\"nowhere at all\"]",
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":"
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\","
    "\"maxLength\":8},\"l\":{\"type\":\"array\",\"items\":{\"enum\":[1,2,3]},\"maxItems\":4}},"
    "\"required\":[\"n\",\"s\",\"l\"],\"additionalProperties\":false}}}",
    "\"response_format\":{\"type\":\"json_object\"}",
    "\"structured_outputs\":{\"regex\":\"(0|[1-9][0-9]*)(, (0|[1-9][0-9]*))*\"}",
    NULL, /* unconstrained, in the same steps */
};

/* Request i: a prompt of 4 .. 90 ids, constraint i % 6, greedy or seeded. */
static void build_jobs(struct th_job *jobs, int n) {
  uint32_t x = 4242;
  for (int i = 0; i < n; i++) {
    int len = 4 + (i * 31) % 87;
    const char *c = constraints[i % 6];
    const char *samp = i % 2 ? "\"temperature\":0.9,\"seed\":7,\"logprobs\":1"
                             : "\"temperature\":0,\"logprobs\":1";
    th_job_make(&jobs[i], len, &x, "\"max_tokens\":%d,%s%s%s,\"stream\":false", GEN, samp,
                c ? "," : "", c ? c : "");
  }
}

/* Runs the jobs against serve on model with `flags`; its answers in jobs. */
static void answers(struct th_job *jobs, const char *model, char *const *flags) {
  struct th_proc p;
  char *all[12] = {"--threads", "1"};
  for (int i = 0; flags[i] && i < 9; i++)
    all[2 + i] = flags[i];
  int port = th_serve_start(&p, model, all);
  TH_REQUIRE(port > 0);
  th_http_run_jobs(jobs, NREQ, port);
  th_proc_stop(&p, 20000);
  th_jobs_check_answered(jobs, NREQ);
}

/* An answer without its logprobs (canonical JSON, malloc'd). */
static char *text_only(const char *answer) {
  json_t *j = json_loads(answer, 0, NULL);
  json_t *c = j ? json_object_get(j, "choice") : NULL;
  if (c) json_object_del(c, "logprobs");
  char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  json_decref(j);
  return s;
}

/* Requests [0, NREQ) step `every` of got against want; texts: without logprobs. */
static void check_same(const struct th_job *want, const struct th_job *got, int every, int texts,
                       const char *what) {
  int same = 0, n = 0;
  for (int i = 0; i < NREQ; i += every, n++) {
    char *w = texts ? text_only(want[i].answer) : strdup(want[i].answer);
    char *g = !got[i].answer ? NULL : texts ? text_only(got[i].answer) : strdup(got[i].answer);
    if (w && g && !strcmp(w, g))
      same++;
    else
      fprintf(stderr, "%s, request %d:\n  want %s\n  got  %s\n", what, i, w ? w : "(none)",
              g ? g : "(none)");
    free(w);
    free(g);
  }
  TH_CHECK_EQ_INT(same, n);
}

TH_TEST(structured_answers_equal_across_scheduling) {
  th_proc_init(1800);
  char model[320];
  th_tiny_gemma4_or_skip("structured", 6, model, sizeof model);
  static struct th_job base[NREQ], other[NREQ];
  build_jobs(base, NREQ);
  build_jobs(other, NREQ);
  answers(base, model, (char *[]){"--no-async-scheduling", NULL});
  /* the choice rows end in one of the choices: the mask worked end to end */
  for (int i = 1; i < NREQ; i += 6)
    TH_CHECK(strstr(base[i].answer, "\"text\":\"north\"") ||
             strstr(base[i].answer, "\"text\":\"south\"") ||
             strstr(base[i].answer, "\"text\":\"east\"") ||
             strstr(base[i].answer, "\"text\":\"west\"") ||
             strstr(base[i].answer, "\"text\":\"nowhere at all\""));
  answers(other, model, (char *[]){"--async-scheduling", NULL});
  check_same(base, other, 1, 0, "async");
  /* a pool of a few requests' worth: requests are preempted and resumed */
  th_http_jobs_free(other, NREQ);
  build_jobs(other, NREQ);
  answers(other, model, (char *[]){"--kv-cache-memory", "600K", "--max-num-seqs", "12", NULL});
  check_same(base, other, 1, 0, "small KV pool");
  th_http_jobs_free(other, NREQ);
  build_jobs(other, NREQ);
  /* two ranks sum their halves of every dot product in another order: the greedy
   * rows' tokens are those of one rank, their logprobs only to f32 rounding */
  answers(other, model, (char *[]){"--tensor-parallel-size", "2", NULL});
  check_same(base, other, 2, 1, "tensor parallel 2, greedy");
  th_http_jobs_free(base, NREQ);
  th_http_jobs_free(other, NREQ);
}

/* A regex whose automaton grows to the compiler's cap takes it most of a second to
 * refuse (0.8 s at -O2 on a 2-core EPYC): the frontend compiles a request's grammar
 * on its thread pool, so a request sent while it compiles is answered first, and
 * the slow one gets its 400 after. */
TH_TEST(structured_slow_grammar_holds_no_other_request) {
  th_proc_init(600);
  char model[320];
  th_tiny_gemma4_or_skip("structured", 6, model, sizeof model);
  struct th_proc p;
  int port = th_serve_start(&p, model, (char *[]){"--threads", "1", NULL});
  TH_REQUIRE(port > 0);
  const char *slow = "{\"prompt\":\"hi\",\"max_tokens\":4,\"structured_outputs\":{\"regex\":"
                     "\"(.{1,15}a|.{1,15}b|.{1,15}c|.{1,15}d|.{1,15}e|.{1,15}f|.{1,15}g|.{1,15}h)"
                     "{1,30}\"}}";
  int fd = th_http_post_open(port, "/v1/completions", slow);
  usleep(50 * 1000); /* read by the server: otherwise the next one could come first */
  char *body = NULL;
  TH_CHECK_EQ_INT(th_http(port, "GET", "/health", NULL, 30000, &body), 200);
  free(body);
  struct pollfd pf = {fd, POLLIN, 0};
  int answered = poll(&pf, 1, 0);
  if (answered) fprintf(stderr, "the slow grammar was answered before /health\n");
  TH_CHECK_EQ_INT(answered, 0);
  TH_CHECK_EQ_INT(th_http_read(fd, 60000, &body), 400);
  TH_CHECK(strstr(body, "\"param\":\"structured_outputs.regex\"") &&
           strstr(body, "automaton states"));
  if (!strstr(body, "automaton states")) fprintf(stderr, "answer: %s\n", body);
  free(body);
  close(fd);
  /* and the server goes on serving constrained requests */
  TH_CHECK_EQ_INT(th_http(port, "POST", "/v1/completions",
                          "{\"prompt\":\"hi\",\"max_tokens\":4,\"guided_choice\":[\"yes\",\"no\"]}",
                          60000, &body),
                  200);
  TH_CHECK(strstr(body, "\"text\":\"yes\"") || strstr(body, "\"text\":\"no\""));
  free(body);
  th_proc_stop(&p, 20000);
}
